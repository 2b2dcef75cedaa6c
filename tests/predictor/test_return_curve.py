"""The survival curve's arithmetic: interpolation, the conditional question, validation."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.return_curve import (
    ReturnCurve,
    continued_hazard_exponent,
    continued_hazard_exponents,
    log_spaced_edges,
)


def curve() -> ReturnCurve:
    return ReturnCurve(np.array([0.0, 10.0, 100.0, 1000.0]), np.array([1.0, 0.6, 0.4, 0.3]))


def test_survival_is_interpolated_in_log_time() -> None:
    c = curve()
    assert c.survival_at(0) == 1.0 and c.survival_at(10) == pytest.approx(0.6)
    assert c.survival_at(5) == pytest.approx(0.8)  # the first interval: linear in t
    assert c.survival_at(np.sqrt(10 * 100)) == pytest.approx(0.5)  # the log midpoint
    assert c.survival_at(5000) == pytest.approx(0.3) == c.never_share


def test_the_conditional_question() -> None:
    c = curve()
    assert c.p_return_within(0, 10) == pytest.approx(0.4)
    assert c.p_return_within(10, 90) == pytest.approx((0.6 - 0.4) / 0.6)
    assert c.p_return_within(2000, 1e6) == 0.0  # nothing returns after the last point
    empty = ReturnCurve(np.array([0.0, 10.0]), np.array([1.0, 0.0]))
    assert empty.p_return_within(20, 5) == 0.0


def test_bad_curves_are_refused() -> None:
    with pytest.raises(ValueError, match="start at 0"):
        ReturnCurve(np.array([1.0, 2.0]), np.array([1.0, 0.5]))
    with pytest.raises(ValueError, match="never increase"):
        ReturnCurve(np.array([0.0, 2.0, 3.0]), np.array([1.0, 0.5, 0.6]))
    with pytest.raises(ValueError, match="first_s"):
        log_spaced_edges(10, 5)
    edges = log_spaced_edges()
    assert edges[0] == 0 and edges[1] == 5 and edges[-1] == pytest.approx(3600)


@pytest.mark.parametrize(
    "times", [[0.0, 5.0, float("nan"), 60.0], [0.0, float("nan")], [0.0, 5.0, float("inf")]]
)
def test_a_grid_with_a_nan_or_infinite_point_is_refused(times: list[float]) -> None:
    """Issue 44, case 2: `diff(t) <= 0` is False for NaN, so such a grid passed."""
    with pytest.raises(ValueError, match="times_s must be finite"):
        ReturnCurve(np.array(times), np.linspace(1.0, 0.5, len(times)))


def test_a_curve_valid_by_construction_answers_the_same_unchecked() -> None:
    checked = curve()
    fast = ReturnCurve.of_valid(checked.times_s, checked.survival)
    for a, w in [(0, 10), (10, 90), (7, 300), (2000, 5)]:
        assert fast.p_return_within(a, w) == checked.p_return_within(a, w)


def test_a_continued_hazard_goes_on_at_the_last_intervals_slope() -> None:
    c = curve()
    beta = continued_hazard_exponent(c.times_s, c.survival)
    assert beta == pytest.approx(np.log(0.4 / 0.3) / np.log(10.0))
    tailed = ReturnCurve(c.times_s, c.survival, beta)
    assert tailed.tail_exponent == pytest.approx(beta)
    assert tailed.survival_at(1000.0) == pytest.approx(0.3)  # unchanged on the grid
    assert tailed.survival_at(500.0) == pytest.approx(c.survival_at(500.0))
    # One more decade beyond the last point loses what the last decade lost, in ratio.
    assert tailed.survival_at(10_000.0) == pytest.approx(0.3 * 0.3 / 0.4)
    assert tailed.p_return_within(2000, 8000) > 0.0 == c.p_return_within(2000, 8000)
    assert tailed.survival_at(1e9) < tailed.survival_at(1e6) < 0.3


def test_the_tail_exponent_is_zero_where_no_slope_is_known_and_refused_when_bad() -> None:
    assert (
        continued_hazard_exponent([0.0, 10.0], [1.0, 0.5]) == 0.0
    )  # the first interval: no log slope
    assert (
        continued_hazard_exponent([0.0, 10.0, 100.0], [1.0, 0.5, 0.5]) == 0.0
    )  # flat last interval
    assert continued_hazard_exponent([0.0, 10.0, 100.0], [1.0, 0.5, 0.0]) == 0.0  # nothing left
    table = np.array([[1.0, 0.6, 0.4, 0.3], [1.0, 0.5, 0.5, 0.5], [1.0, 0.5, 0.1, 0.0]])
    times = np.array([0.0, 10.0, 100.0, 1000.0])
    expected = [np.log(0.4 / 0.3) / np.log(10.0), 0.0, 0.0]  # by hand, row by row
    assert continued_hazard_exponents(times, table) == pytest.approx(expected)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="tail_exponent"):
            ReturnCurve(np.array([0.0, 1.0]), np.array([1.0, 0.5]), bad)
