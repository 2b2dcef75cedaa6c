"""The turns-only ablation: one implementation for training metrics and the A/B harness."""

from __future__ import annotations

import pytest

from lpc.replay.probability import TurnsSource
from lpc.workload import ScriptedTurn
from training.turns_baseline import TurnsBaseline


def test_rates_per_turn_bin():
    # conversations of 1, 2 and 3 turns: turn 1 continues in 2 of 3, turn 2 in 1 of 2
    baseline = TurnsBaseline.fit([1, 2, 3])
    assert baseline.rates == {1: 2 / 3, 2: 1 / 2, 3: 0.0}
    assert baseline.base_rate == pytest.approx(3 / 6)
    assert baseline.rate(9) == baseline.base_rate  # unseen bin


def test_majority_label_is_the_papers_lpc_turns():
    baseline = TurnsBaseline.fit([1, 2, 3], majority=True)
    assert [baseline.rate(k) for k in (1, 2, 3)] == [1.0, 1.0, 0.0]
    assert baseline.predict_counts([1, 3]).tolist() == [1.0, 0.0]


def test_counts_above_the_last_bin_share_it():
    baseline = TurnsBaseline.fit([5], max_turn_bin=2)
    assert baseline.rates == {1: 1.0, 2: 0.75}
    assert baseline.rate(40) == 0.75


def test_lpc_turns_source_is_the_same_fit():
    counts = [1, 1, 2, 4, 4, 6]
    source = TurnsSource.fit(counts)
    baseline = TurnsBaseline.fit(counts)
    turns = [ScriptedTurn("c", k, [1, 2], 1, True) for k in range(7)]
    assert source.predict(turns) == [baseline.rate(k + 1) for k in range(7)]
    assert source.name == "turns"


def test_needs_data():
    with pytest.raises(ValueError, match="zero conversations"):
        TurnsBaseline.fit([])
