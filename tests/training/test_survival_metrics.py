"""Kaplan–Meier, Harrell's C, IPCW Brier and cumulative/dynamic AUC against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.return_curve import ReturnCurve, log_spaced_edges
from training.survival_metrics import (
    StepSurvival,
    brier_score,
    censoring_survival,
    concordance_index,
    cumulative_dynamic_auc,
    integrated_brier_score,
    kaplan_meier,
    survival_on_times,
)


def test_kaplan_meier_hand_case() -> None:
    # at 1: 5 at risk, 1 return; at 2: 4 at risk (the row censored at 2 included), 1 return;
    # at 3: 2 at risk, 1 return
    km = kaplan_meier(np.array([1, 2, 2, 3, 4.0]), np.array([1, 1, 0, 1, 0], bool))
    assert km.value_at([0.5, 1, 2, 2.5, 3, 10]) == pytest.approx([1, 0.8, 0.6, 0.6, 0.3, 0.3])
    assert km.value_before(2.0) == pytest.approx(0.8)


def test_a_censored_row_is_not_an_ending() -> None:
    time_s = np.array([1.0, 5.0])
    censored = kaplan_meier(time_s, np.array([True, False]))
    ended = kaplan_meier(time_s, np.array([True, True]))
    assert censored.value_at(10.0) == pytest.approx(0.5)  # silent after 5 s: not known to end
    assert ended.value_at(10.0) == pytest.approx(0.0)
    # the censoring distribution flips the indicator
    g = censoring_survival(time_s, np.array([True, False]))
    assert g.value_at(2.0) == pytest.approx(1.0) and g.value_at(5.0) == pytest.approx(0.0)


def test_concordance_hand_cases() -> None:
    time_s, observed = np.array([1.0, 2.0, 3.0]), np.array([True, True, False])
    assert concordance_index(time_s, observed, np.array([3, 2, 1.0])) == pytest.approx(1.0)
    assert concordance_index(time_s, observed, np.array([1, 2, 3.0])) == pytest.approx(0.0)
    # pair (0, 1) tied in risk counts half: (0.5 + 1 + 1) / 3
    assert concordance_index(time_s, observed, np.array([2, 2, 1.0])) == pytest.approx(2.5 / 3)
    # a censored row is never the earlier one of a pair
    only_censored_first = concordance_index(
        np.array([1.0, 2.0]), np.array([False, True]), np.array([1.0, 0.0])
    )
    assert np.isnan(only_censored_first)


def test_cumulative_dynamic_auc_hand_case() -> None:
    time_s = np.array([1.0, 2.0, 3.0, 4.0])
    observed = np.ones(4, bool)
    g = StepSurvival(np.array([1.5]), np.array([0.5]))  # G = 1 before 1.5 s, 0.5 after
    # cases 0 (weight 1/G(1−) = 1) and 1 (weight 1/G(2−) = 2); controls 2, 3 with risks 2, 0
    auc = cumulative_dynamic_auc(time_s, observed, np.array([1, 3, 2, 0.0]), 2.5, g)
    assert auc == pytest.approx((1 * 1 + 2 * 2) / (3 * 2))
    no_censoring = censoring_survival(time_s, observed)
    assert cumulative_dynamic_auc(time_s, observed, -time_s, 2.5, no_censoring) == 1.0
    # a row censored before t is neither case nor control
    censored = np.array([True, False, True, True])
    assert cumulative_dynamic_auc(
        time_s, censored, np.array([1, 9, 2, 0.0]), 2.5, no_censoring
    ) == pytest.approx(0.5)


def test_brier_score_hand_case() -> None:
    g = StepSurvival(np.array([0.5]), np.array([0.8]))
    score = brier_score(np.array([1.0, 3.0]), np.array([True, False]), np.array([0.2, 0.7]), 2.0, g)
    assert score == pytest.approx((0.2**2 / 0.8 + 0.3**2 / 0.8) / 2)
    # a row censored before t weighs nothing
    score = brier_score(np.array([1.0]), np.array([False]), np.array([0.3]), 2.0, g)
    assert score == 0.0


def test_integrated_brier_of_a_constant_score() -> None:
    time_s = np.array([100.0, 200.0])
    observed = np.array([False, False])
    g = StepSurvival(np.zeros(0), np.zeros(0))
    grid = np.linspace(1.0, 50.0, 30)
    survival = np.full((2, grid.size), 0.9)  # both silent all along: (1 − 0.9)² everywhere
    assert integrated_brier_score(time_s, observed, survival, grid, g) == pytest.approx(0.01)


def test_survival_on_times_matches_return_curve() -> None:
    rng = np.random.default_rng(3)
    grid = log_spaced_edges(5.0, 900.0, 10)
    drops = rng.uniform(0.0, 0.2, size=(4, grid.size - 1))
    survival = np.concatenate([np.ones((4, 1)), 1.0 - np.cumsum(drops, axis=1) / 2.5], axis=1)
    times = np.array([0.0, 1.0, 5.0, 7.3, 60.0, 899.0, 900.0, 5000.0])
    values = survival_on_times(grid, survival, times)
    for row in range(4):
        curve = ReturnCurve(grid, survival[row])
        assert values[row] == pytest.approx([curve.survival_at(t) for t in times])
