"""Return-curve sources: the true return times, Kaplan–Meier per turn, and the replay path
that carries them to the `lpc-return` evictor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from eviction.return_window import TurnoverEstimate
from lpc.errors import InvalidInputError
from lpc.replay.ab_options import ABOptions
from lpc.replay.ab_run import run_ab
from lpc.replay.policies import parse_policies, parse_policy
from lpc.replay.return_sources import (
    NEVER_RETURNS,
    TurnReturnCurves,
    check_trained_before,
    kaplan_meier,
    load_return_model,
    next_arrivals,
    return_curves,
    step_curve,
    true_return_curves,
)
from lpc.replay.two_tier import TierSettings
from lpc.workload import ScriptedTurn, WorkloadRequest
from predictor.artifact import ArtifactIncompatibleError
from predictor.return_time import ReturnInput, ReturnModelMetadata, save_return_model
from tests.lpc.traces.helpers import bundled_lines, write_lines


def request(conv: str, turn: int, arrival: float, completion: float) -> WorkloadRequest:
    scripted = ScriptedTurn(conv, turn, [1, 2, 3, 4], 2, has_next_turn=False)
    return WorkloadRequest(f"{conv}-{turn}", scripted, arrival, completion)


def test_the_true_curve_steps_at_the_conversations_next_arrival() -> None:
    requests = [
        request("a", 0, 0.0, 2.0),
        request("b", 0, 1.0, 3.0),
        request("a", 1, 12.0, 13.0),
    ]
    assert next_arrivals(requests) == [12.0, None, None]
    curves = true_return_curves(requests)
    assert curves[1] is NEVER_RETURNS and curves[2] is NEVER_RETURNS
    a = curves[0]  # returns 10 s after its release
    assert a.p_return_within(0.0, 11.0) == 1.0
    assert a.p_return_within(0.0, 9.0) == 0.0
    assert a.p_return_within(5.0, 6.0) == 1.0
    assert a.p_return_within(10.5, 100.0) == 0.0  # it has come back already
    assert NEVER_RETURNS.p_return_within(3.0, 1e6) == 0.0
    assert step_curve(-1.0).p_return_within(1.0, 10.0) == 0.0


def test_kaplan_meier_matches_the_product_limit_by_hand() -> None:
    durations = np.array([1.0, 2.0, 2.0, 3.0, 4.0])
    observed = np.array([True, True, False, True, False])
    grid = np.array([0.0, 1.5, 2.5, 3.5, 10.0])
    # At 1: 1 of 5 → 4/5; at 2: 1 of 4 → 3/5; 2 censored; at 3: 1 of 2 → 3/10.
    assert kaplan_meier(durations, observed, grid) == pytest.approx([1.0, 0.8, 0.6, 0.3, 0.3])


def test_km_per_turn_is_fitted_on_the_training_part_and_censored_at_its_end() -> None:
    requests = []
    for c in range(40):  # first turns: half come back after 20 s, half never
        requests.append(request(f"c{c}", 0, c * 0.1, c * 0.1 + 1.0))
        if c % 2 == 0:
            requests.append(request(f"c{c}", 1, c * 0.1 + 21.0, c * 0.1 + 22.0))
    requests.sort(key=lambda r: r.arrival_s)
    requests.append(request("late", 0, 1000.0, 1001.0))  # the evaluation part
    first_eval = len(requests) - 1
    grid = np.array([0.0, 10.0, 20.0, 30.0, 60.0, 1000.0, 2000.0])
    fitted = TurnReturnCurves.fit(requests, first_eval, grid_s=grid, min_samples=30)
    assert fitted.samples[1] == 40 and 2 not in fitted.by_turn  # 20 second turns: pooled
    first = fitted.curve_for(requests[0])
    assert first.survival_at(10.0) == pytest.approx(1.0)
    assert first.survival_at(30.0) == pytest.approx(0.5)  # returns 20 s after release
    assert first.p_return_within(0.0, 30.0) == pytest.approx(0.5)
    assert first.p_return_within(30.0, 60.0) == pytest.approx(0.0)  # the rest never return
    assert fitted.curve_for(requests[-1]) is first  # an evaluation request of turn 1
    curves = return_curves("km-turn", requests, first_eval)
    assert len(curves) == len(requests)
    with pytest.raises(ValueError, match="unknown return-curve source"):
        return_curves("hazard", requests, first_eval)


def test_the_turnover_window_is_queued_blocks_over_the_eviction_rate() -> None:
    window = TurnoverEstimate(initial_s=60.0, weight=1.0)
    window.observe_interval(queued=100, elapsed_s=5.0, evicted=10)
    assert window.value_s == pytest.approx(50.0)
    window.observe_interval(queued=100, elapsed_s=5.0, evicted=0)  # no pressure: unchanged
    assert window.value_s == pytest.approx(50.0) and window.observed == 1


def test_the_return_policies_parse_with_their_curve_sources() -> None:
    true, km = parse_policies("lpc-return-true,lpc-return-km")
    assert (true.evictor, true.curve_source, true.is_upper_bound) == (
        "lpc-return",
        "true-return",
        True,
    )
    assert (km.evictor, km.curve_source, km.is_upper_bound) == ("lpc-return", "km-turn", False)
    with pytest.raises(ValueError, match="unknown policy"):
        parse_policy("lpc-return")


def tiny_return_model(folder: Path, notes: dict | None = None, seed: int = 0) -> Path:
    """A random 3-feature hazard MLP (one hidden layer of 4) on a 4-point grid."""
    rng = np.random.default_rng(seed)
    names = ("log_turn", "log_prompt_tokens", "log_think_time_s")
    metadata = ReturnModelMetadata(
        grid_s=(0.0, 5.0, 50.0, 500.0),
        inputs=tuple(ReturnInput(n, 1.0, 2.0) for n in names),
        hidden_sizes=(4,),
        notes=notes or {},
    )
    weights = [rng.normal(size=(3, 4)), rng.normal(size=(4, 3))]
    biases = [rng.normal(size=4), rng.normal(size=3)]
    save_return_model(folder, metadata, weights, biases)
    return folder


def test_the_model_source_gives_each_release_a_valid_curve_from_its_features(
    tmp_path: Path,
) -> None:
    model = load_return_model(tiny_return_model(tmp_path / "m"))
    requests = [request("a", 0, 0.0, 2.0), request("b", 0, 1.0, 3.0), request("a", 1, 30.0, 31.0)]
    curves = return_curves("model", requests, first_eval=2, model=model)
    assert len(curves) == len(requests)
    for curve in curves:
        s = np.asarray(curve.survival)
        assert s[0] == 1.0 and np.all((s >= 0.0) & (s <= 1.0))
        assert np.all(np.diff(s) <= 0.0)
        assert 0.0 <= curve.p_return_within(7.0, 100.0) <= 1.0
    # A second turn after a 27-s think differs from a first turn in its features: its curve too.
    assert not np.allclose(curves[0].survival, curves[2].survival)
    with pytest.raises(InvalidInputError, match="needs a return-time model"):
        return_curves("model", requests, first_eval=2)


def test_a_model_that_is_not_a_return_time_model_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "classifier"
    folder.mkdir()
    (folder / "metadata.json").write_text(json.dumps({"predicts": "continuation_probability"}))
    with pytest.raises(ArtifactIncompatibleError, match="return_time_survival") as caught:
        load_return_model(folder)
    assert "\n" not in str(caught.value)
    with pytest.raises(InvalidInputError, match="not an artifact"):
        load_return_model(tmp_path / "missing")


def test_a_model_trained_past_the_replays_training_part_is_refused(tmp_path: Path) -> None:
    notes = {"trace": "mooncake", "split": {"train_requests": 100}}
    model = load_return_model(tiny_return_model(tmp_path / "m", notes))
    check_trained_before(model, "mooncake", first_eval=100)  # the same training part
    check_trained_before(model, "other-trace", first_eval=10)  # another trace: not checked
    with pytest.raises(InvalidInputError, match="past this replay's training part"):
        check_trained_before(model, "mooncake", first_eval=99)


@pytest.mark.usefixtures("no_plots")  # reads no PNG
def test_the_model_policy_replays_a_trace_slice_in_either_tier(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "slice.jsonl", bundled_lines()[:300])
    tiers = TierSettings((1_000_000,), tuple(parse_policies("lru,lpc-return-model")))
    outcome = run_ab(
        ABOptions(
            trace=path,
            policies=tuple(parse_policies("lru,lpc-return-model,belady")),
            cache_sizes_tokens=(1_000_000,),
            workers=1,
            progress=False,
            out_dir=tmp_path / "o",
            tiers=tiers,
            return_model=tiny_return_model(tmp_path / "m"),
        ),
        log=lambda _: None,
    )
    ratio = outcome.to_json()["comparison"]["hit_ratio"]
    for size in ratio["lru"]:
        assert 0.0 < ratio["lpc-return-model"][size] <= ratio["belady"][size] + 1e-12
    pairs = {(r.policy, r.offload_policy): r for r in outcome.two_tier}
    host = pairs[("lru", "lpc-return-model")]
    assert host.device_hit_ratio == pairs[("lru", "lru")].device_hit_ratio  # same GPU tier
    assert 0.0 < host.hit_ratio <= 1.0
