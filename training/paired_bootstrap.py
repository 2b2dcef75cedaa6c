"""The paired bootstrap over conversations behind every 95 % interval LPC reports.

Resample weights drawn from a seed, the percentile interval of a figure's draws, and the
paired gain Σ ours / Σ theirs − 1; the callers (`lpc.replay.intervals`,
`lpc.replay.two_tier_intervals`, `training.quality_intervals`) compute their own figures under
these weights. Why conversations are the unit, and the two draw schemes: docs/design.md,
"Statistics: paired intervals".
"""

from __future__ import annotations

from typing import Literal

import numpy as np

N_RESAMPLES = 1000
CONFIDENCE = 0.95
SEED = 0

# How a resample draws its conversations. Both draw `count` conversations with replacement,
# uniformly; they differ only in the random stream: "indices" draws the indices one by one
# (scipy.stats.bootstrap's draws, row by row), "multinomial" the counts in one multinomial draw.
Draw = Literal["indices", "multinomial"]
# Two implementations of the same linear percentile (Hyndman and Fan's type 7) that round
# differently in the last bit: numpy's `percentile` and scipy's `stats.quantile`.
Quantile = Literal["numpy", "scipy"]


def resample_weights(
    conversations: np.ndarray,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
    *,
    count: int | None = None,
    draw: Draw = "indices",
) -> np.ndarray:
    """(n_resamples, len(conversations)) float64 weights: row b holds, for each data row, how
    often its conversation was drawn in resample b, all conversations drawn with replacement.
    The conversations are the distinct ids in `conversations`; with `count`, the ids are
    indices and every index in [0, count) is one, so an index with no row is drawn too (and
    weighs nothing)."""
    ids = np.asarray(conversations).ravel()
    if count is None:
        codes = np.unique(ids, return_inverse=True)[1].ravel()
        count = int(codes.max()) + 1 if codes.size else 0
    else:
        codes = ids.astype(np.int64)
        if codes.size and (codes.min() < 0 or codes.max() >= count):
            raise ValueError(
                f"conversation indices must lie in [0, {count}), got {codes.min()}..{codes.max()}"
            )
    rng = np.random.default_rng(seed)
    if draw == "multinomial":
        drawn = rng.multinomial(count, np.full(count, 1.0 / count), size=n_resamples)
        return drawn[:, codes].astype(np.float64)
    if draw != "indices":
        raise ValueError(f"draw must be 'indices' or 'multinomial', got {draw!r}")
    weights = np.empty((n_resamples, codes.size))
    for b in range(n_resamples):
        weights[b] = np.bincount(rng.integers(0, count, count), minlength=count)[codes]
    return weights


def percentile_interval(
    draws: np.ndarray,
    confidence: float = CONFIDENCE,
    *,
    quantile: Quantile = "numpy",
    omit_undefined: bool = True,
) -> list[float] | None:
    """The central `confidence` percentile interval of a figure's draws, [low, high].
    `omit_undefined` (the quality table's rule): a draw where the figure is undefined (NaN or
    infinite: no comparable pair, one class left) is left out, None when none is defined.
    Without it the draws are read as they are, as the replay's intervals always have been: a
    resample with nothing to divide by makes the interval NaN, not a narrower one."""
    draws = np.asarray(draws, dtype=np.float64)
    if omit_undefined:
        draws = draws[np.isfinite(draws)]
        if draws.size == 0:
            return None
    if quantile == "scipy":
        from scipy import stats

        alpha = np.float64((1.0 - confidence) / 2)
        low, high = stats.quantile(draws, np.stack([alpha, 1 - alpha]), axis=-1)
    elif quantile == "numpy":
        tail = (1.0 - confidence) / 2 * 100
        low, high = np.percentile(draws, [tail, 100 - tail])
    else:
        raise ValueError(f"quantile must be 'numpy' or 'scipy', got {quantile!r}")
    return [float(low), float(high)]


def paired_gain(
    ours: np.ndarray, theirs: np.ndarray, weights: np.ndarray | None = None
) -> float | np.ndarray:
    """Σ ours / Σ theirs − 1, paired: over the rows as they are (`weights` None: a float), or
    per resample, each row counted as often as its weight says (an array, one per row of
    `weights`; NaN or infinite where the resample's Σ theirs is 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if weights is None:
            return float(np.sum(ours) / np.sum(theirs) - 1.0)
        return (weights @ ours) / (weights @ theirs) - 1.0


def weighted_mean(weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Σ w_i value_i / Σ w_i for each row of `weights`."""
    return (weights @ values) / weights.sum(1)


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Per row of `weights`, the smallest value whose weighted CDF reaches q (inverted CDF):
    the percentile of the resample with each value repeated as often as its weight."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[:, order], axis=1)
    threshold = q * cumulative[:, -1:]
    index = np.argmax(cumulative >= threshold, axis=1)
    return values[order][index]
