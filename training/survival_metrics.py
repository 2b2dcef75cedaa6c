"""Scoring return-time predictions on censored data: Kaplan–Meier, Harrell's C, IPCW Brier, AUC.

Every metric takes durations `time_s` and `observed`; a censored row is never counted as an
ending. Pure numpy; `tests/training/test_survival_metrics.py` checks each against
hand-computed cases.

Each metric's definition: docs/design.md, "Survival metrics".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepSurvival:
    """A right-continuous step function: `value_at(t)` = survival after every event <= t."""

    event_times_s: np.ndarray  # distinct, increasing
    survival: np.ndarray  # S right after each event time

    def value_at(self, t_s: np.ndarray | float) -> np.ndarray:
        index = np.searchsorted(self.event_times_s, np.asarray(t_s, float), side="right")
        padded = np.concatenate([[1.0], self.survival])
        return padded[index]

    def value_before(self, t_s: np.ndarray | float) -> np.ndarray:
        """S(t−): survival just before t (the censoring weight of an event at t)."""
        index = np.searchsorted(self.event_times_s, np.asarray(t_s, float), side="left")
        padded = np.concatenate([[1.0], self.survival])
        return padded[index]


def kaplan_meier(
    time_s: np.ndarray, observed: np.ndarray, weights: np.ndarray | None = None
) -> StepSurvival:
    """Kaplan–Meier estimate; a row censored at an event time is still at risk there."""
    time_s = np.asarray(time_s, float)
    observed = np.asarray(observed, bool)
    weights = np.ones_like(time_s) if weights is None else np.asarray(weights, float)
    events = np.unique(time_s[observed])
    if events.size == 0:
        return StepSurvival(np.zeros(0), np.zeros(0))
    order = np.argsort(time_s, kind="stable")
    sorted_times, sorted_weights = time_s[order], weights[order]
    # at risk at t: weight of rows with time >= t
    tail = np.concatenate([np.cumsum(sorted_weights[::-1])[::-1], [0.0]])
    at_risk = tail[np.searchsorted(sorted_times, events, side="left")]
    died = np.bincount(
        np.searchsorted(events, time_s[observed]), weights=weights[observed], minlength=events.size
    )
    factors = np.where(at_risk > 0, 1.0 - died / np.where(at_risk > 0, at_risk, 1.0), 1.0)
    return StepSurvival(events, np.cumprod(factors))


def censoring_survival(time_s: np.ndarray, observed: np.ndarray) -> StepSurvival:
    """G(t) = P(C > t): Kaplan–Meier of the censoring times (a return censors the censoring)."""
    return kaplan_meier(time_s, ~np.asarray(observed, bool))


def concordance_index(time_s: np.ndarray, observed: np.ndarray, risk: np.ndarray) -> float:
    """Harrell's C: pairs (i, j) with i observed and T_i < T_j; concordant when risk_i >
    risk_j, half when equal. Higher risk must mean an earlier return."""
    time_s = np.asarray(time_s, float)
    observed = np.asarray(observed, bool)
    risk = np.asarray(risk, float)
    order = np.argsort(time_s, kind="stable")
    time_s, observed, risk = time_s[order], observed[order], risk[order]
    concordant, comparable = 0.0, 0.0
    for start in range(0, len(time_s), 512):
        rows = np.arange(start, min(start + 512, len(time_s)))
        rows = rows[observed[rows]]
        if rows.size == 0:
            continue
        later = time_s[None, :] > time_s[rows, None]  # (rows, n)
        higher = risk[rows, None] > risk[None, :]
        tied = risk[rows, None] == risk[None, :]
        comparable += later.sum()
        concordant += (later & higher).sum() + 0.5 * (later & tied).sum()
    if comparable == 0:
        return float("nan")
    return float(concordant / comparable)


def brier_losses(
    time_s: np.ndarray,
    observed: np.ndarray,
    survival_at_t: np.ndarray,
    t_s: float,
    censoring: StepSurvival,
) -> np.ndarray:
    """Each row's IPCW Brier loss at `t_s` (Graf et al. 1999): S_i(t)² / G(T_i−) for a return
    by t, (1 − S_i(t))² / G(t) for a row still silent at t, 0 for one censored before t."""
    time_s = np.asarray(time_s, float)
    observed = np.asarray(observed, bool)
    s = np.asarray(survival_at_t, float)
    returned = observed & (time_s <= t_s)
    silent = time_s > t_s
    g_event = censoring.value_before(time_s)
    g_t = float(censoring.value_at(t_s))
    with np.errstate(divide="ignore", invalid="ignore"):
        case = np.where(returned & (g_event > 0), s**2 / g_event, 0.0)
    control = np.where(silent, (1.0 - s) ** 2 / g_t, 0.0) if g_t > 0 else np.zeros_like(s)
    return case + control


def brier_score(
    time_s: np.ndarray,
    observed: np.ndarray,
    survival_at_t: np.ndarray,
    t_s: float,
    censoring: StepSurvival,
) -> float:
    """IPCW Brier score at `t_s` of predictions S_i(t): the mean of `brier_losses`."""
    return float(np.mean(brier_losses(time_s, observed, survival_at_t, t_s, censoring)))


def integrated_brier_score(
    time_s: np.ndarray,
    observed: np.ndarray,
    survival_on_grid: np.ndarray,
    grid_s: np.ndarray,
    censoring: StepSurvival,
) -> float:
    """Trapezoid integral of the Brier score over `grid_s`, divided by the grid's length;
    `survival_on_grid` is (n, len(grid_s))."""
    grid_s = np.asarray(grid_s, float)
    scores = np.array(
        [
            brier_score(time_s, observed, survival_on_grid[:, k], t, censoring)
            for k, t in enumerate(grid_s)
        ]
    )
    return float(np.trapezoid(scores, grid_s) / (grid_s[-1] - grid_s[0]))


def cumulative_dynamic_auc(
    time_s: np.ndarray,
    observed: np.ndarray,
    risk: np.ndarray,
    t_s: float,
    censoring: StepSurvival,
) -> float:
    """AUC at `t_s`: cases returned by t (weight 1/G(T_i−)), controls silent after t (a
    row censored before t is neither)."""
    time_s = np.asarray(time_s, float)
    observed = np.asarray(observed, bool)
    risk = np.asarray(risk, float)
    cases = observed & (time_s <= t_s)
    controls = time_s > t_s
    if not cases.any() or not controls.any():
        return float("nan")
    g = censoring.value_before(time_s[cases])
    weights = np.where(g > 0, 1.0 / np.where(g > 0, g, 1.0), 0.0)
    control_risk = np.sort(risk[controls])
    case_risk = risk[cases]
    below = np.searchsorted(control_risk, case_risk, side="left")
    equal = np.searchsorted(control_risk, case_risk, side="right") - below
    wins = below + 0.5 * equal
    return float(np.sum(weights * wins) / (np.sum(weights) * control_risk.size))


def survival_on_times(grid_s: np.ndarray, survival: np.ndarray, t_s: np.ndarray) -> np.ndarray:
    """(n, len(t_s)) values of n curves on one grid (`survival` is (n, len(grid_s))), with
    `ReturnCurve.survival_at`'s interpolation: linear in t on the first interval, linear in
    log t after, constant beyond the last point."""
    grid_s = np.asarray(grid_s, float)
    survival = np.atleast_2d(np.asarray(survival, float))
    t = np.clip(np.asarray(t_s, float), 0.0, grid_s[-1])
    k = np.clip(np.searchsorted(grid_s, t, side="right"), 1, len(grid_s) - 1)
    t0, t1 = grid_s[k - 1], grid_s[k]
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(
            t0 <= 0.0,
            t / t1,
            np.log(np.maximum(t, 1e-300) / np.where(t0 > 0, t0, 1.0))
            / np.log(t1 / np.maximum(t0, 1e-300)),
        )
    w = np.where(t >= grid_s[-1], 1.0, w)
    return survival[:, k - 1] + w * (survival[:, k] - survival[:, k - 1])
