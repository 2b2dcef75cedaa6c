"""95 % intervals for the return-time quality table: a paired bootstrap over conversations.

`training.return_quality` scores a source once; a figure without its interval cannot say
whether the hazard model and a baseline differ. A conversation's releases share its history,
so conversations, not releases, are resampled (with replacement, seeded); every source is
scored on the same resamples, so differences between sources (model − Kaplan–Meier, model −
classifier) get paired intervals. The censoring distribution G comes from the training part
and is not resampled: only the scored part is.

A resample is a weight per release (how often its conversation was drawn), and every metric
is a weighted one, equal to the metric of the resampled rows written out (tested):
- Brier at t and the integrated Brier score are means of a per-release loss;
- Harrell's C and the IPCW AUC at t are ratios of sums over pairs, Σ_ij w_i w_j K_ij, whose
  pair kernel K does not depend on the draw. All resamples are scored at once, a block of
  rows at a time: (K_rows @ Wᵀ), then each resample's own row weights (float32 sums:
  agreement with the float64 metric to about 1e-6).
Percentile intervals at 2.5 % and 97.5 %; a resample where a figure is undefined (no
comparable pair, one class left) is left out of that figure's interval.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from training.return_quality import CONCORDANCE_HORIZON_S, HORIZONS_S, IBS_GRID_S
from training.survival_metrics import StepSurvival, survival_on_times

DEFAULT_RESAMPLES = 1000
CONFIDENCE = 0.95
SEED = 0
ROW_BLOCK = 512  # rows of a pair kernel built at a time


@dataclass(frozen=True)
class CurveSource:
    """Survival curves, (n, len(grid_s)), on one grid: scored on every figure."""

    grid_s: np.ndarray
    survival: np.ndarray


@dataclass(frozen=True)
class HorizonSource:
    """A classifier's P(return within `horizon_s`): scored on C, AUC and Brier there."""

    horizon_s: float
    p_within: np.ndarray


Source = CurveSource | HorizonSource


def resample_weights(conversations: np.ndarray, n_resamples: int, seed: int = SEED) -> np.ndarray:
    """(n_resamples, n) float32 weights: row i's weight in resample b is how often its
    conversation was drawn when all conversations are drawn with replacement."""
    codes = np.unique(np.asarray(conversations), return_inverse=True)[1].ravel()
    count = int(codes.max()) + 1 if codes.size else 0
    rng = np.random.default_rng(seed)
    weights = np.empty((n_resamples, codes.size), np.float32)
    for b in range(n_resamples):
        drawn = np.bincount(rng.integers(0, count, count), minlength=count)
        weights[b] = drawn[codes]
    return weights


def pair_sums(
    weights: np.ndarray,
    left: np.ndarray,
    kernel_rows: Callable[[int, int], np.ndarray],
) -> np.ndarray:
    """Σ_ij w_bi left_i K_ij w_bj for every resample b (rows of `weights`), with K built
    `ROW_BLOCK` rows at a time by `kernel_rows(start, stop)` ((stop − start, n), float32)."""
    n = weights.shape[1]
    totals = np.zeros(weights.shape[0], np.float64)
    weights_t = np.ascontiguousarray(weights.T)  # (n, B)
    for start in range(0, n, ROW_BLOCK):
        stop = min(start + ROW_BLOCK, n)
        rows_left = left[start:stop]
        if not rows_left.any():
            continue
        inner = kernel_rows(start, stop) @ weights_t  # (rows, B): Σ_j K_ij w_bj
        outer = weights_t[start:stop] * rows_left[:, None].astype(np.float32)
        totals += np.einsum("rb,rb->b", outer, inner, dtype=np.float64)
    return totals


def weighted_concordance(
    weights: np.ndarray, time_s: np.ndarray, observed: np.ndarray, risk: np.ndarray
) -> np.ndarray:
    """Harrell's C (`survival_metrics.concordance_index`) under each row of `weights`."""
    time_s, risk = np.asarray(time_s, float), np.asarray(risk, float)
    left = np.asarray(observed, bool)

    def later(start: int, stop: int) -> np.ndarray:
        return time_s[None, :] > time_s[start:stop, None]

    def concordant(start: int, stop: int) -> np.ndarray:
        mine = risk[start:stop, None]
        score = (mine > risk[None, :]) + 0.5 * (mine == risk[None, :])
        return (later(start, stop) * score).astype(np.float32)

    comparable = pair_sums(weights, left, lambda a, b: later(a, b).astype(np.float32))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(comparable > 0, pair_sums(weights, left, concordant) / comparable, np.nan)


def weighted_auc(
    weights: np.ndarray,
    time_s: np.ndarray,
    observed: np.ndarray,
    risk: np.ndarray,
    t_s: float,
    censoring: StepSurvival,
) -> np.ndarray:
    """The IPCW cumulative/dynamic AUC at `t_s`
    (`survival_metrics.cumulative_dynamic_auc`) under each row of `weights`."""
    time_s, risk = np.asarray(time_s, float), np.asarray(risk, float)
    cases = np.asarray(observed, bool) & (time_s <= t_s)
    controls = (time_s > t_s).astype(np.float32)
    g = censoring.value_before(time_s)
    case_weight = np.where(cases & (g > 0), 1.0 / np.where(g > 0, g, 1.0), 0.0)

    def wins(start: int, stop: int) -> np.ndarray:
        mine = risk[start:stop, None]
        score = (mine > risk[None, :]) + 0.5 * (mine == risk[None, :])
        return (score * controls[None, :]).astype(np.float32)

    numerator = pair_sums(weights, case_weight, wins)
    denominator = (weights @ case_weight.astype(np.float32)).astype(np.float64) * (
        weights @ controls
    ).astype(np.float64)
    undefined = (weights[:, cases].sum(1) == 0) | (weights @ controls == 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(undefined | (denominator <= 0), np.nan, numerator / denominator)


def brier_losses(
    time_s: np.ndarray,
    observed: np.ndarray,
    survival_at_t: np.ndarray,
    t_s: float,
    censoring: StepSurvival,
) -> np.ndarray:
    """Each release's IPCW Brier loss at `t_s`; their mean is `survival_metrics.brier_score`."""
    time_s = np.asarray(time_s, float)
    s = np.asarray(survival_at_t, float)
    returned = np.asarray(observed, bool) & (time_s <= t_s)
    g_event = censoring.value_before(time_s)
    g_t = float(censoring.value_at(t_s))
    with np.errstate(divide="ignore", invalid="ignore"):
        case = np.where(returned & (g_event > 0), s**2 / g_event, 0.0)
    control = np.where(time_s > t_s, (1.0 - s) ** 2 / g_t, 0.0) if g_t > 0 else np.zeros_like(s)
    return case + control


def weighted_mean(weights: np.ndarray, losses: np.ndarray) -> np.ndarray:
    """Σ w_i loss_i / Σ w_i for each row of `weights`."""
    return (weights.astype(np.float64) @ losses) / weights.sum(1, dtype=np.float64)


def figure_draws(
    weights: np.ndarray,
    time_s: np.ndarray,
    observed: np.ndarray,
    source: Source,
    censoring: StepSurvival,
) -> dict[str, np.ndarray]:
    """Every figure `training.return_quality` reports for `source`, once per resample:
    'concordance', 'integrated_brier', 'auc@T' and 'brier@T'."""
    draws: dict[str, np.ndarray] = {}
    if isinstance(source, HorizonSource):
        p = np.asarray(source.p_within, float)
        key = f"{source.horizon_s:g}"
        draws["concordance"] = weighted_concordance(weights, time_s, observed, p)
        draws[f"auc@{key}"] = weighted_auc(
            weights, time_s, observed, p, source.horizon_s, censoring
        )
        draws[f"brier@{key}"] = weighted_mean(
            weights, brier_losses(time_s, observed, 1.0 - p, source.horizon_s, censoring)
        )
        return draws
    at = survival_on_times(
        source.grid_s, source.survival, np.array([*HORIZONS_S, CONCORDANCE_HORIZON_S])
    )
    draws["concordance"] = weighted_concordance(weights, time_s, observed, 1.0 - at[:, -1])
    on_ibs = survival_on_times(source.grid_s, source.survival, IBS_GRID_S)
    per_time = np.stack(
        [
            brier_losses(time_s, observed, on_ibs[:, k], t, censoring)
            for k, t in enumerate(IBS_GRID_S)
        ],
        axis=1,
    )
    integrated = np.trapezoid(per_time, IBS_GRID_S, axis=1) / (IBS_GRID_S[-1] - IBS_GRID_S[0])
    draws["integrated_brier"] = weighted_mean(weights, integrated)
    for k, t in enumerate(HORIZONS_S):
        draws[f"auc@{t:g}"] = weighted_auc(weights, time_s, observed, 1.0 - at[:, k], t, censoring)
        draws[f"brier@{t:g}"] = weighted_mean(
            weights, brier_losses(time_s, observed, at[:, k], t, censoring)
        )
    return draws


def percentile_interval(draws: np.ndarray, confidence: float = CONFIDENCE) -> list[float] | None:
    """The percentile interval of the defined draws (None when none is)."""
    defined = draws[np.isfinite(draws)]
    if defined.size == 0:
        return None
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(defined, [tail, 100 - tail])
    return [float(low), float(high)]


def nested(intervals: Mapping[str, list[float] | None]) -> dict[str, Any]:
    """{'auc@60': x} → {'auc': {'60': x}}, the shape of `return_quality`'s figures."""
    out: dict[str, Any] = {}
    for name, interval in intervals.items():
        if "@" in name:
            figure, at = name.split("@")
            out.setdefault(figure, {})[at] = interval
        else:
            out[name] = interval
    return out


def quality_intervals(
    time_s: np.ndarray,
    observed: np.ndarray,
    conversations: np.ndarray,
    sources: Mapping[str, Source],
    censoring: StepSurvival,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = SEED,
    differences: tuple[tuple[str, str], ...] = (),
) -> dict[str, Any]:
    """Per source, the 95 % interval of each of its figures; per pair (a, b) in
    `differences`, the paired interval of a − b on the figures both report.
    {'resamples': n, 'sources': {name: figures}, 'differences': {'a - b': figures}}."""
    time_s = np.asarray(time_s, float)
    observed = np.asarray(observed, bool)
    if len(conversations) != time_s.size:
        raise ValueError(f"{len(conversations)} conversation ids for {time_s.size} releases")
    weights = resample_weights(conversations, n_resamples, seed)
    draws = {
        name: figure_draws(weights, time_s, observed, source, censoring)
        for name, source in sources.items()
    }
    report: dict[str, Any] = {
        "resamples": n_resamples,
        "confidence": CONFIDENCE,
        "sources": {
            name: nested({k: percentile_interval(v) for k, v in figures.items()})
            for name, figures in draws.items()
        },
        "differences": {},
    }
    for a, b in differences:
        if a not in draws or b not in draws:
            continue
        shared = [k for k in draws[a] if k in draws[b]]
        report["differences"][f"{a} - {b}"] = nested(
            {k: percentile_interval(draws[a][k] - draws[b][k]) for k in shared}
        )
    return report
