"""The one paired bootstrap: weights that draw whole conversations, reproduce the draws each
caller has always made (scipy's `bootstrap` for the single tier, a multinomial for the two
tiers), and weighted figures equal to the figures of the resampled rows written out."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from training.paired_bootstrap import (
    paired_gain,
    percentile_interval,
    resample_weights,
    weighted_mean,
    weighted_percentile,
)

conversation_ids = st.lists(st.integers(0, 12), min_size=1, max_size=40)
seeds = st.integers(0, 2**32 - 1)
FAST = settings(max_examples=30, deadline=None)


@FAST
@given(ids=conversation_ids, seed=seeds)
def test_weights_draw_whole_conversations(ids: list[int], seed: int) -> None:
    labels = np.array([f"c{i}" for i in ids])  # any hashable id, not only indices
    weights = resample_weights(labels, 20, seed)
    distinct, first = np.unique(labels, return_index=True)
    assert weights.shape == (20, len(ids))
    for i, label in enumerate(labels):  # a conversation's rows share its weight
        assert np.array_equal(weights[:, i], weights[:, first[np.searchsorted(distinct, label)]])
    # every resample draws as many conversations as there are
    assert np.all(weights[:, first].sum(1) == distinct.size)
    assert np.array_equal(weights, resample_weights(labels, 20, seed))


@FAST
@given(ids=conversation_ids, seed=seeds, extra=st.integers(0, 5))
def test_with_a_count_every_index_is_a_conversation(ids: list[int], seed: int, extra: int) -> None:
    count = max(ids) + 1 + extra
    for draw in ("indices", "multinomial"):
        weights = resample_weights(np.array(ids), 15, seed, count=count, draw=draw)
        everyone = resample_weights(np.arange(count), 15, seed, count=count, draw=draw)
        assert np.all(everyone.sum(1) == count)
        assert np.array_equal(weights, everyone[:, ids])  # an index without rows is drawn too


def test_multinomial_draws_are_one_multinomial_per_resample() -> None:
    conversations = np.array([0, 3, 3, 1, 4, 0])
    weights = resample_weights(conversations, 5, 7, count=6, draw="multinomial")
    counts = np.random.default_rng(7).multinomial(6, [1 / 6] * 6, size=5)
    assert np.array_equal(weights, counts[:, conversations].astype(float))


def test_bad_draws_and_indices_are_refused() -> None:
    with pytest.raises(ValueError, match=r"lie in \[0, 3\)"):
        resample_weights(np.array([0, 3]), 4, count=3)
    with pytest.raises(ValueError, match="draw must be"):
        resample_weights(np.array([0, 1]), 4, draw="poisson")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="quantile must be"):
        percentile_interval(np.arange(5.0), quantile="R")  # type: ignore[arg-type]


@FAST
@given(
    pairs=st.lists(st.tuples(st.integers(0, 50), st.integers(1, 50)), min_size=2, max_size=25),
    seed=seeds,
    confidence=st.sampled_from([0.8, 0.9, 0.95]),
)
def test_index_draws_and_scipy_quantiles_are_scipys_paired_bootstrap(
    pairs: list[tuple[int, int]], seed: int, confidence: float
) -> None:
    ours = np.array([p[0] for p in pairs], dtype=float)
    theirs = np.array([p[1] for p in pairs], dtype=float)
    count = ours.size
    weights = resample_weights(np.arange(count), 40, seed, count=count)
    draws = paired_gain(ours, theirs, weights)

    def gain(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return a.sum(axis=axis) / b.sum(axis=axis) - 1.0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        reference = stats.bootstrap(
            (ours, theirs),
            gain,
            paired=True,
            vectorized=True,
            n_resamples=40,
            confidence_level=confidence,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    assert np.array_equal(draws, reference.bootstrap_distribution)
    interval = percentile_interval(draws, confidence, quantile="scipy")
    assert interval == [float(v) for v in reference.confidence_interval]
    assert paired_gain(ours, theirs) == float(gain(ours, theirs))


@FAST
@given(
    values=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=60),
    confidence=st.floats(0.5, 0.99),
)
def test_the_interval_is_the_percentiles_of_the_defined_draws(
    values: list[float], confidence: float
) -> None:
    draws = np.array(values)
    tail = (1 - confidence) / 2 * 100
    expected = [float(v) for v in np.percentile(draws, [tail, 100 - tail])]
    with_undefined = np.concatenate([draws, [np.nan, np.inf, -np.inf]])
    assert percentile_interval(with_undefined, confidence) == expected
    assert expected[0] <= expected[1]
    # scipy's arithmetic for the same percentile: equal but for rounding
    low, high = percentile_interval(draws, confidence, quantile="scipy") or (None, None)
    assert low == pytest.approx(expected[0]) and high == pytest.approx(expected[1])


def test_no_defined_draw_is_no_interval() -> None:
    assert percentile_interval(np.array([np.nan, np.inf])) is None
    assert percentile_interval(np.array([])) is None
    assert percentile_interval(np.full(9, 2.5)) == [2.5, 2.5]


@pytest.mark.parametrize("quantile", ["numpy", "scipy"])
def test_draws_read_as_they_are_make_an_undefined_draw_an_undefined_interval(quantile) -> None:
    draws = np.array([0.1, 0.2, np.nan, 0.3])
    kept = percentile_interval(draws, quantile=quantile, omit_undefined=False)
    assert kept is not None and np.isnan(kept).all()
    assert percentile_interval(draws, quantile=quantile) == percentile_interval(
        np.array([0.1, 0.2, 0.3]), quantile=quantile
    )


@FAST
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 100), st.integers(1, 100), st.integers(0, 3)),
        min_size=1,
        max_size=30,
    ),
    q=st.sampled_from([0.1, 0.5, 0.9]),
)
def test_weighted_figures_equal_the_figures_of_the_repeated_rows(
    rows: list[tuple[int, int, int]], q: float
) -> None:
    ours = np.array([r[0] for r in rows], dtype=float)
    theirs = np.array([r[1] for r in rows], dtype=float)
    weights = np.array([[r[2] for r in rows]], dtype=float)
    weights[0, 0] += 1  # at least one row drawn
    repeats = weights[0].astype(int)
    repeated_ours, repeated_theirs = np.repeat(ours, repeats), np.repeat(theirs, repeats)
    assert paired_gain(ours, theirs, weights)[0] == pytest.approx(
        repeated_ours.sum() / repeated_theirs.sum() - 1
    )
    assert weighted_mean(weights, ours)[0] == pytest.approx(repeated_ours.mean())
    assert weighted_percentile(ours, weights, q)[0] == np.percentile(
        repeated_ours, 100 * q, method="inverted_cdf"
    )
