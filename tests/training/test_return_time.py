"""The return-time model's targets, likelihood, choices and per-turn baseline."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictor.return_curve import ReturnCurve
from predictor.return_time import survival_from_logits
from training.return_data import ReturnPart, ReturnTargets, return_targets
from training.return_fit import (
    KM_MIN_ROWS_PER_TURN,
    choose_candidate,
    density_constant,
    fit_turn_kaplan_meier,
    interval_index,
    log_likelihood,
    mixture_nll,
    served_layers,
)

torch = pytest.importorskip("torch")


def _table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "conversation_id": ["a", "b", "c", "a", "c"],
            "arrival_s": [0.0, 50.0, 60.0, 100.0, 61.0],
            "completion_s": [10.0, 60.0, 70.0, 110.0, 65.0],
        }
    ).sort_values("arrival_s", kind="stable")


def test_targets_from_completion_to_next_arrival_censored_at_the_end() -> None:
    table = _table()  # order: a0, b0, c0, c1, a1
    targets = return_targets(table, end_s=200.0)
    assert targets.observed.tolist() == [True, False, True, False, False]
    # a0 → a1: 100 − 10; c0 → c1 arrived before c0 finished: 0; the rest silent to 200 s
    assert targets.time_s == pytest.approx([90.0, 140.0, 0.0, 135.0, 90.0])


def test_a_next_request_after_the_end_is_unknown_not_an_ending() -> None:
    targets = return_targets(_table(), end_s=80.0)
    # a0's next request (100 s) lies after the end: censored at 80 − 10, not "ended"
    assert targets.observed.tolist() == [False, False, True, False, False]
    assert targets.time_s[:4] == pytest.approx([70.0, 20.0, 0.0, 15.0])
    assert np.isnan(targets.time_s[4])  # a1 arrives after the end: no row of this part


GRID = np.array([0.0, 10.0, 100.0])


def _ll(time_s: float, observed: bool, logits=(0.0, 0.0)) -> float:
    index = interval_index(GRID, np.array([time_s]))
    return float(log_likelihood(torch.tensor([logits]), index, np.array([observed]))[0])


def test_likelihood_hand_cases() -> None:
    # hazards 0.5 and 0.5: S(10) = 0.5, S(100) = 0.25
    assert _ll(50.0, True) == pytest.approx(np.log(0.25))  # P(second interval)
    assert _ll(5.0, True) == pytest.approx(np.log(0.5))  # P(first interval)
    w = np.log(5.0) / np.log(10.0)
    assert _ll(50.0, False) == pytest.approx(np.log(0.5 * (1 - 0.5 * w)))  # S(50), interpolated
    assert _ll(5.0, False) == pytest.approx(np.log(0.75))  # linear in t on the first interval
    assert _ll(0.0, False) == pytest.approx(0.0)  # censored at once: no information
    assert _ll(500.0, True) == pytest.approx(np.log(0.25))  # after the grid: S(t_K)
    assert _ll(500.0, False) == pytest.approx(np.log(0.25))
    # hazards 0.2, 0.4: an observed return in interval 2 → 0.8 · 0.4
    logits = (np.log(0.2 / 0.8), np.log(0.4 / 0.6))
    assert _ll(20.0, True, logits) == pytest.approx(np.log(0.8 * 0.4), rel=1e-5)


def test_censored_likelihood_is_the_served_curve() -> None:
    logits = np.array([[0.3, -1.0, 0.5]])
    grid = np.array([0.0, 5.0, 40.0, 300.0])
    curve = ReturnCurve(grid, survival_from_logits(logits)[0])
    times = np.array([2.0, 5.0, 17.0, 40.0, 123.0, 300.0, 900.0])
    index = interval_index(grid, times)
    ll = log_likelihood(
        torch.tensor(np.repeat(logits, len(times), axis=0)), index, np.zeros(len(times), bool)
    ).numpy()
    assert np.exp(ll) == pytest.approx([curve.survival_at(t) for t in times], rel=1e-6)


def test_density_integrates_to_one_with_the_mass_beyond_the_grid() -> None:
    logits = np.array([[-0.5, 0.2, -1.0]])
    grid = np.array([0.0, 5.0, 40.0, 300.0])
    times = np.concatenate([np.linspace(1e-6, 5.0, 4001), np.geomspace(5.0, 300.0, 40001)[1:]])
    targets = ReturnTargets(times, np.ones(times.size, bool))
    index = interval_index(grid, times)
    ll = log_likelihood(
        torch.tensor(np.repeat(logits, times.size, axis=0), dtype=torch.float64),
        index,
        targets.observed,
    ).numpy()
    density = np.exp(ll + density_constant(grid, targets))
    beyond = survival_from_logits(logits)[0, -1]
    assert np.trapezoid(density, times) + beyond == pytest.approx(1.0, abs=1e-3)


def test_choose_candidate_prefers_the_simpler_within_the_margin() -> None:
    candidates = [
        {"grid_count": 8, "hidden": [], "val_nll": 1.905},
        {"grid_count": 8, "hidden": [32], "val_nll": 1.8995},
        {"grid_count": 12, "hidden": [32, 32], "val_nll": 1.890},
    ]
    assert choose_candidate(candidates)["hidden"] == [32, 32]
    candidates[2]["val_nll"] = 1.8985  # within 0.002 of the one-layer model
    assert choose_candidate(candidates)["hidden"] == [32]


def test_turn_kaplan_meier_pools_the_sparse_turns() -> None:
    n0, n1, n2 = KM_MIN_ROWS_PER_TURN + 50, KM_MIN_ROWS_PER_TURN, 30
    turns = np.concatenate([np.zeros(n0), np.ones(n1), np.full(n2, 2), np.full(n2, 3)])
    rng = np.random.default_rng(0)
    time_s = rng.exponential(100.0, turns.size)
    observed = rng.random(turns.size) < 0.5
    part = ReturnPart(np.zeros((turns.size, 1)), ReturnTargets(time_s, observed), turns, None)
    km = fit_turn_kaplan_meier(part, np.array([0.0, 10.0, 100.0, 1000.0]))
    # turn 1 has enough rows but the turns after it do not: it starts the pooled tail
    assert km.pooled_from == 1 and km.rows_by_turn == (n0, n1 + 2 * n2)
    assert (km.survival(np.array([0, 1, 2, 7]))[:, 0] == 1.0).all()
    assert km.survival(np.array([3]))[0] == pytest.approx(km.survival(np.array([1]))[0])
    for turn in range(5):
        assert km.curve(turn).survival == pytest.approx(km.survival(np.array([turn]))[0])


def test_mixture_nll_averages_the_members_likelihoods() -> None:
    a, b = np.log(np.array([0.2, 0.5])), np.log(np.array([0.4, 0.1]))
    expected = -np.mean(np.log([0.3, 0.3]))
    assert mixture_nll([a, b]) == pytest.approx(expected)


def test_merged_networks_serve_the_members_average_curve(tmp_path) -> None:
    from predictor.return_time import (
        ReturnInput,
        ReturnModelMetadata,
        ReturnTimePredictor,
        save_return_model,
    )

    rng = np.random.default_rng(1)
    grid = np.array([0.0, 5.0, 40.0, 300.0])
    networks = []
    for seed in range(3):
        torch.manual_seed(seed)
        networks.append(
            torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 3))
        )
    members = [served_layers([network]) for network in networks]
    weights, biases = served_layers(networks)
    metadata = ReturnModelMetadata(
        grid_s=tuple(grid),
        inputs=(ReturnInput("log_turn", 0.0, 1.0), ReturnInput("log_prompt_tokens", 0.0, 1.0)),
        hidden_sizes=(9,),
        members=3,
    )
    save_return_model(tmp_path / "m", metadata, weights, biases)
    predictor = ReturnTimePredictor.load(tmp_path / "m")
    x = rng.normal(size=(5, 2))
    alone = [
        survival_from_logits(np.maximum(x @ w[0] + b[0], 0.0) @ w[1] + b[1]) for w, b in members
    ]
    assert predictor.survival(x) == pytest.approx(np.mean(alone, axis=0), rel=1e-5)
