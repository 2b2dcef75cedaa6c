"""95 % intervals for the return-time quality table: a paired bootstrap over conversations.

Every source is scored on the same resamples of conversations, so differences between sources
get paired intervals; the censoring distribution G comes from the training part and is not
resampled. Every metric is a weighted one, equal to the metric of the resampled rows written
out, and Harrell's C runs in O(n log n) vector operations per bootstrap.

The weighted metrics: docs/design.md, "Statistics: paired intervals" and "The return-time
quality intervals".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from training.paired_bootstrap import (
    CONFIDENCE,
    N_RESAMPLES,
    SEED,
    percentile_interval,
    resample_weights,
    weighted_mean,
)
from training.return_quality import CONCORDANCE_HORIZON_S, HORIZONS_S, IBS_GRID_S
from training.survival_metrics import StepSurvival, brier_losses, survival_on_times

BLOCK_BYTES = 64 * 2**20  # a block of resamples' running sums stays within this


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


class ResampleFenwick:
    """A Fenwick tree over `size` positions whose values are vectors, one entry per resample:
    add a vector at a position, read the sum of positions 0..k for every resample at once."""

    def __init__(self, size: int, resamples: int) -> None:
        self.size = size
        self.tree = np.zeros((size + 1, resamples))

    def add(self, position: int, values: np.ndarray) -> None:
        i, tree, size = position + 1, self.tree, self.size
        while i <= size:
            tree[i] += values
            i += i & -i

    def prefix(self, position: int) -> np.ndarray:
        """Σ of positions 0..`position` (zeros when `position` < 0)."""
        total = np.zeros(self.tree.shape[1])
        i, tree = position + 1, self.tree
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total


def resample_blocks(weights: np.ndarray, positions: int) -> list[np.ndarray]:
    """`weights` cut into blocks of resamples small enough that a (positions × block) table
    of float64 stays within `BLOCK_BYTES`."""
    per_block = max(1, BLOCK_BYTES // (8 * max(positions, 1)))
    return [weights[i : i + per_block] for i in range(0, weights.shape[0], per_block)]


def weighted_concordance(
    weights: np.ndarray, time_s: np.ndarray, observed: np.ndarray, risk: np.ndarray
) -> np.ndarray:
    """Harrell's C (`survival_metrics.concordance_index`) under each row of `weights`.

    Releases are taken latest first, one group of equal times at a time; before a group is
    added to the tree (by its risk's rank), each observed release of it reads the weight of
    those already in, i.e. with a strictly later time: comparable pairs, and below / equal to
    its own risk, concordant and tied ones. O(n log n) vector operations per block."""
    time_s, risk = np.asarray(time_s, float), np.asarray(risk, float)
    observed = np.asarray(observed, bool)
    levels, rank = np.unique(risk, return_inverse=True)
    order = np.argsort(-time_s, kind="stable")
    group_starts = np.flatnonzero(np.r_[True, np.diff(time_s[order]) != 0])
    group_ends = np.r_[group_starts[1:], order.size]
    concordant, comparable = [], []
    for block in resample_blocks(weights, levels.size):
        tree = ResampleFenwick(levels.size, block.shape[0])
        seen = np.zeros(block.shape[0])
        pairs = np.zeros(block.shape[0])
        agree = np.zeros(block.shape[0])
        for lo, hi in zip(group_starts, group_ends, strict=True):
            group = order[lo:hi]
            for i in group[observed[group]]:
                w = block[:, i]
                below, upto = tree.prefix(rank[i] - 1), tree.prefix(rank[i])
                pairs += w * seen
                agree += w * (below + 0.5 * (upto - below))
            for j in group:
                tree.add(rank[j], block[:, j])
                seen += block[:, j]
        concordant.append(agree)
        comparable.append(pairs)
    agree, pairs = np.concatenate(concordant), np.concatenate(comparable)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pairs > 0, agree / pairs, np.nan)


def weighted_auc(
    weights: np.ndarray,
    time_s: np.ndarray,
    observed: np.ndarray,
    risk: np.ndarray,
    t_s: float,
    censoring: StepSurvival,
) -> np.ndarray:
    """The IPCW cumulative/dynamic AUC at `t_s`
    (`survival_metrics.cumulative_dynamic_auc`) under each row of `weights`: the controls'
    weights summed in risk order, read at each case's risk. O(n log n + B n)."""
    time_s, risk = np.asarray(time_s, float), np.asarray(risk, float)
    cases = np.flatnonzero(np.asarray(observed, bool) & (time_s <= t_s))
    controls = np.flatnonzero(time_s > t_s)
    if cases.size == 0 or controls.size == 0:
        return np.full(weights.shape[0], np.nan)
    g = censoring.value_before(time_s[cases])
    case_weight = np.where(g > 0, 1.0 / np.where(g > 0, g, 1.0), 0.0)
    by_risk = controls[np.argsort(risk[controls], kind="stable")]
    sorted_risk = risk[by_risk]
    below = np.searchsorted(sorted_risk, risk[cases], side="left")
    upto = np.searchsorted(sorted_risk, risk[cases], side="right")
    out = []
    for block in resample_blocks(weights, controls.size + cases.size):
        cumulative = np.zeros((block.shape[0], by_risk.size + 1))
        np.cumsum(block[:, by_risk], axis=1, out=cumulative[:, 1:])
        wins = 0.5 * (cumulative[:, below] + cumulative[:, upto])  # below + equal / 2
        case_mass = block[:, cases] * case_weight
        numerator = np.einsum("bc,bc->b", case_mass, wins)
        denominator = case_mass.sum(1) * cumulative[:, -1]
        with np.errstate(divide="ignore", invalid="ignore"):
            undefined = (block[:, cases].sum(1) == 0) | (cumulative[:, -1] == 0)
            out.append(np.where(undefined | (denominator <= 0), np.nan, numerator / denominator))
    return np.concatenate(out)


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
    n_resamples: int = N_RESAMPLES,
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
