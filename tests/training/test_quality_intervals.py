"""The quality table's bootstrap: each weighted figure equals the figure of the resampled rows
written out, and the intervals behave as intervals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training.paired_bootstrap import resample_weights
from training.quality_intervals import (
    CurveSource,
    HorizonSource,
    figure_draws,
    quality_intervals,
)
from training.return_quality import curve_quality, horizon_quality
from training.survival_metrics import censoring_survival


def synthetic_part(seed: int, n: int = 300):
    """Releases of ~n/3 conversations: return times, censoring, curves that know a little."""
    rng = np.random.default_rng(seed)
    speed = rng.uniform(0.2, 3.0, n)
    returns = rng.exponential(200.0 / speed)
    censor = rng.uniform(20.0, 1500.0, n)
    time_s = np.round(np.minimum(returns, censor))  # rounded: ties in time
    observed = returns <= censor
    grid_s = np.array([0.0, 5.0, 30.0, 60.0, 180.0, 600.0, 900.0])
    hazard = np.clip(speed + rng.normal(0, 0.5, n), 0.05, None)[:, None] / 300.0
    survival = np.exp(-hazard * grid_s[None, :])
    survival = np.round(survival, 2)  # ties in risk
    conversations = rng.integers(0, n // 3, n).astype(str)
    training = censoring_survival(rng.uniform(0, 1500.0, 400), rng.random(400) < 0.4)
    return time_s, observed, grid_s, survival, conversations, training


def close(figure: float) -> object:
    """Equal to `figure` but for rounding; a figure undefined both ways (NaN) is equal."""
    return pytest.approx(figure, abs=1e-6, nan_ok=True)


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_weighted_figures_equal_the_resampled_rows_figures(seed: int) -> None:
    time_s, observed, grid_s, survival, conversations, censoring = synthetic_part(seed)
    weights = resample_weights(conversations, 4, seed=seed)
    p = 1.0 - survival[:, 4]  # P(return within 180 s) of the curves
    curve = figure_draws(weights, time_s, observed, CurveSource(grid_s, survival), censoring)
    horizon = figure_draws(weights, time_s, observed, HorizonSource(180.0, p), censoring)
    # a figure a resample leaves undefined (one class left) is NaN both ways
    for b, row in enumerate(weights):
        repeats = row.astype(np.int64)
        t, e = np.repeat(time_s, repeats), np.repeat(observed, repeats)
        expected = curve_quality(t, e, grid_s, np.repeat(survival, repeats, axis=0), censoring)
        assert curve["concordance"][b] == close(expected["concordance"])
        assert curve["integrated_brier"][b] == close(expected["integrated_brier"])
        for at in ("60", "180", "600"):
            assert curve[f"auc@{at}"][b] == close(expected["auc"][at])
            assert curve[f"brier@{at}"][b] == close(expected["brier"][at])
        clf = horizon_quality(t, e, np.repeat(p, repeats), 180.0, censoring)
        assert horizon["concordance"][b] == close(clf["concordance"])
        assert horizon["auc@180"][b] == close(clf["auc"]["180"])
        assert horizon["brier@180"][b] == close(clf["brier"]["180"])


def test_unit_weights_give_the_point_figures() -> None:
    time_s, observed, grid_s, survival, _, censoring = synthetic_part(3)
    ones = np.ones((1, time_s.size), np.float32)
    draws = figure_draws(ones, time_s, observed, CurveSource(grid_s, survival), censoring)
    expected = curve_quality(time_s, observed, grid_s, survival, censoring)
    assert draws["concordance"][0] == pytest.approx(expected["concordance"], abs=1e-6)
    assert draws["auc@600"][0] == pytest.approx(expected["auc"]["600"], abs=1e-6)


def test_intervals_hold_the_point_and_differences_are_paired() -> None:
    time_s, observed, grid_s, survival, conversations, censoring = synthetic_part(4, n=600)
    sources = {
        "model": CurveSource(grid_s, survival),
        "same": CurveSource(grid_s, survival.copy()),
        "flat": CurveSource(grid_s, np.tile(survival.mean(0), (time_s.size, 1))),
    }
    report = quality_intervals(
        time_s,
        observed,
        conversations,
        sources,
        censoring,
        n_resamples=200,
        differences=(("model", "same"), ("model", "flat")),
    )
    point = curve_quality(time_s, observed, grid_s, survival, censoring)
    low, high = report["sources"]["model"]["concordance"]
    assert low < point["concordance"] < high
    low, high = report["sources"]["model"]["auc"]["180"]
    assert low < point["auc"]["180"] < high
    # a source against itself differs by exactly 0 in every resample
    assert report["differences"]["model - same"]["concordance"] == [0.0, 0.0]
    # curves that know something rank better than one curve for all, in every resample
    flat_low, _ = report["differences"]["model - flat"]["concordance"]
    assert flat_low > 0
    # a flat curve ranks nobody: C is 1/2 in every resample
    assert report["sources"]["flat"]["concordance"] == pytest.approx([0.5, 0.5])


def test_a_mismatched_conversation_column_is_refused() -> None:
    time_s, observed, grid_s, survival, conversations, censoring = synthetic_part(5)
    with pytest.raises(ValueError, match="conversation ids for"):
        quality_intervals(
            time_s, observed, conversations[:-1], {"m": CurveSource(grid_s, survival)}, censoring
        )


def test_blocks_of_resamples_give_the_same_figures(monkeypatch) -> None:
    import training.quality_intervals as qi

    time_s, observed, grid_s, survival, conversations, censoring = synthetic_part(6)
    weights = resample_weights(conversations, 9, seed=2)
    source = CurveSource(grid_s, survival)
    whole = figure_draws(weights, time_s, observed, source, censoring)
    monkeypatch.setattr(qi, "BLOCK_BYTES", 8 * 2 * (time_s.size + 1))  # two resamples a block
    assert len(qi.resample_blocks(weights, time_s.size)) == 5
    split = figure_draws(weights, time_s, observed, source, censoring)
    for figure, values in whole.items():
        assert np.allclose(values, split[figure], rtol=1e-12, atol=0, equal_nan=True), figure
