"""`lpc-return` in the vLLM plugin, without vLLM: the return-time model loaded in process, the
curve of each release from the access features the engine knows then, the refusals at load,
the fail-safe (a model that raises or gives no survival curve: the fallback score, counted,
logged once), its reloads, W in the metrics, and shadow mode. The stand-in engine is
test_fail_safe.py's (LPC on it as the scheduler class runs it on vLLM's); the
real-vLLM counterpart is test_vllm_scheduler.py (`lpc-return` in vLLM's own scheduler)."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eviction import Release
from eviction.return_window import ReturnWindowEvictor
from lpc.integrations import vllm_plugin
from lpc.integrations.access_runtime import AccessRuntime
from lpc.integrations.config import PluginConfig, PluginConfigError, load_config
from lpc.integrations.conversation_table import ConversationTable
from lpc.integrations.metrics import _Collector
from lpc.integrations.return_runtime import LoadedReturnModel, ReturnModelRuntime, curve_problem
from lpc.integrations.vllm_plugin import PluginRuntime, build_runtime
from predictor.access_features import ConversationState, RequestState
from predictor.return_curve import ReturnCurve
from tests.integrations.access_models import SHIPPED as SHIPPED_ACCESS
from tests.integrations.test_fail_safe import Request, StepClock, make_runtime, run_engine
from tests.predictor.broken_artifacts import damaged_copy

SHIPPED_RETURN = SHIPPED_ACCESS.parent / "mooncake-return"


def return_runtime(**config: Any) -> PluginRuntime:
    settings = {
        "evictor": "lpc-return",
        "return_model": str(SHIPPED_RETURN),
        "trust_request_hints": True,  # requests carry p as a trusted API layer sets it
        **config,
    }
    config_ = PluginConfig(stats_log_interval_s=0.0, **settings)
    return build_runtime(config_, clock=StepClock())


def conversation_requests(conversation: str) -> Callable[[int, str], dict[str, Any]]:
    return lambda i, c: {"lpc_conversation_id": c}


# -- load ------------------------------------------------------------------------------------
def test_lpc_return_is_refused_without_a_return_model_or_with_another_artifact(
    tmp_path: Path,
) -> None:
    with pytest.raises(PluginConfigError, match="needs a return-time model: set LPC_RETURN_MODEL"):
        build_runtime(PluginConfig(evictor="lpc-return"))
    with pytest.raises(PluginConfigError, match="not a return-time model") as refused:
        return_runtime(return_model=str(SHIPPED_ACCESS))
    assert "\n" not in str(refused.value)
    with pytest.raises(PluginConfigError, match=r"LPC_RETURN_MODEL .* cannot load"):
        return_runtime(return_model=str(tmp_path / "nowhere"))
    # NaN weights (written past the writer, which refuses them): refused by the shared check.
    broken = damaged_copy(SHIPPED_RETURN, tmp_path / "nan", tensor="layers.2.weight")
    with pytest.raises(PluginConfigError, match=r"'layers\.2\.weight' holds NaN or infinity"):
        return_runtime(return_model=str(broken))


def test_the_return_model_is_configured_by_environment() -> None:
    config = load_config(
        {
            "LPC_EVICTOR": "lpc-return",
            "LPC_RETURN_MODEL": str(SHIPPED_RETURN),
            "LPC_RETURN_MODEL_RELOAD_S": "0",
        }
    )
    assert (config.evictor, config.return_model, config.return_model_reload_s) == (
        "lpc-return",
        str(SHIPPED_RETURN),
        0.0,
    )
    with pytest.raises(PluginConfigError, match="LPC_RETURN_MODEL_RELOAD_S"):
        load_config({"LPC_RETURN_MODEL_RELOAD_S": "-1"})


# -- the release path ---------------------------------------------------------------------------
def test_each_release_carries_the_models_curve_from_the_access_features(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With both models in process, one `RequestState` and `ConversationState` per release
    feed the access model's p and the return model's curve, and the release carries exactly
    the return model's curve for them; the free queue runs the return-window evictor."""
    runtime = return_runtime(access_model=str(SHIPPED_ACCESS))
    access = runtime.access
    assert access is not None and access.model is not None and access.returns is not None
    seen: dict[str, list[tuple[RequestState, ConversationState]]] = {"p": [], "curve": []}
    predictor = access.predictor
    returns = access.returns.model.predictor
    original_p, original_curve = predictor.predict_one, returns.curve_one
    curves: list[ReturnCurve] = []

    def spy_p(state: RequestState, conversation: ConversationState) -> float:
        seen["p"].append((state, conversation))
        return original_p(state, conversation)

    def spy_curve(state: RequestState, conversation: ConversationState) -> ReturnCurve:
        seen["curve"].append((state, conversation))
        curves.append(original_curve(state, conversation))
        return curves[-1]

    monkeypatch.setattr(predictor, "predict_one", spy_p)
    monkeypatch.setattr(returns, "curve_one", spy_curve)
    released: list[Release] = []
    original_release = runtime.release_for
    monkeypatch.setattr(
        runtime, "release_for", lambda r: released.append(original_release(r)) or released[-1]
    )
    run = run_engine(runtime, lambda i, c: {"lpc_conversation_id": c}, monkeypatch, steps=400)
    stats = run.stats
    assert stats["releases"] == stats["return_curves_in_process"] == len(released) > 0
    assert stats["predictions_in_process"] == stats["releases"]
    assert stats["plugin_errors"] == stats["return_curve_errors"] == 0
    assert seen["p"] == seen["curve"], "both models read the same state"
    assert all(a[0] is b[0] for a, b in zip(seen["p"], seen["curve"], strict=True))
    assert [r.return_curve for r in released] == curves
    # Later turns see their conversation's history and the engine's times.
    assert max(c.requests_so_far for _, c in seen["curve"]) > 1
    assert all(s.completion_s >= s.arrival_s for s, _ in seen["curve"])
    assert isinstance(runtime.queues.evictor, ReturnWindowEvictor)
    assert runtime.queues.evictor.rekeys > 0, "no eviction re-keyed the queue"


def test_the_return_model_runs_without_an_access_model_and_beside_a_requests_p() -> None:
    runtime = return_runtime()
    assert runtime.access is not None and runtime.access.model is None
    clock = runtime.queues.clock
    first = Request("r0", 5, {"lpc_conversation_id": "c"})
    second = Request("r1", 9, {"lpc_conversation_id": "c", "lpc_probability": 0.3})
    clock.now = 10.0
    release = runtime.release_for(first)
    assert isinstance(release.return_curve, ReturnCurve) and release.probability is None
    clock.now = 20.0
    release = runtime.release_for(second)  # its own p stands; the curve still comes
    assert release.probability == 0.3 and isinstance(release.return_curve, ReturnCurve)
    assert runtime.access.table.entries["c"].state.requests_so_far == 2
    stats = runtime.stats.snapshot()
    assert stats["return_curves_in_process"] == 2 and stats["fallbacks_used"] == 1


# -- fail-safe ------------------------------------------------------------------------------------
GRID = np.array([0.0, 5.0, 60.0, 600.0])


class FakeReturnModel:
    """A return model whose curve for request i is `answer(i)` (raising if that raises)."""

    feature_names: tuple[str, ...] = ()

    def __init__(self, answer: Callable[[int], Any]) -> None:
        self.answer = answer
        self.grid_s = GRID

    def curve_one(self, request: RequestState, conversation: ConversationState) -> Any:
        return self.answer(int(request.arrival_s))


def with_returns(runtime: PluginRuntime, answer: Callable[[int], Any]) -> PluginRuntime:
    model = LoadedReturnModel(FakeReturnModel(answer), ("fake", 0, 0), False)  # type: ignore[arg-type]
    returns = ReturnModelRuntime(Path("fake"), model, runtime.stats, 0.0)
    table = ConversationTable(100, 3600.0, 10**6)
    runtime.access = AccessRuntime(None, None, table, runtime.stats, 0.0, returns=returns)
    return runtime


def good_curve(i: int) -> ReturnCurve:
    """Request i's conversation returns within a minute with a chance that depends on i."""
    stays = ((i * 37) % 97 + 1) / 100.0
    return ReturnCurve.of_valid(GRID, np.array([1.0, 1.0, stays, stays]))


BAD_CURVES: dict[str, Callable[[], Any]] = {
    "raises": lambda: (_ for _ in ()).throw(RuntimeError("model down")),
    "nan": lambda: ReturnCurve.of_valid(GRID, np.array([1.0, np.nan, np.nan, np.nan])),
    "rises": lambda: ReturnCurve.of_valid(GRID, np.array([1.0, 0.2, 0.9, 0.9])),
    "not-a-curve": lambda: {"survival": [1.0, 0.5]},
    "other-grid": lambda: ReturnCurve.of_valid(np.array([0.0, 0.0, 1.0]), np.ones(3)),
}


def fault_run(bad: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    def answer(i: int) -> Any:
        return BAD_CURVES[bad]() if i % 4 == 1 else good_curve(i)

    runtime = with_returns(make_runtime("lpc-return"), answer)
    return run_engine(runtime, lambda i, c: {"lpc_conversation_id": c}, monkeypatch, steps=200)


def test_a_curve_that_fails_takes_the_fallback_score_counted_and_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every step keeps the invariants and loses no block (`run_engine` checks), a failed
    curve is counted where it failed, and every kind of failure gives the same eviction order:
    the fallback score's, which is not the good curves' order."""
    orders = {}
    for bad in BAD_CURVES:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="vllm.plugins.lpc"):
            run = fault_run(bad, monkeypatch)
        stats = run.stats
        failed = stats["return_curve_errors"] + stats["invalid_return_curves"]
        assert failed > 1 and stats["plugin_errors"] == 0
        assert stats["return_curves_in_process"] + failed == stats["releases"]
        counter = "return_curve_errors" if bad == "raises" else "invalid_return_curves"
        assert stats[counter] == failed
        assert caplog.text.count(f"counted in {counter}") == 1, "logged once"
        orders[bad] = run.orders
    assert len({json.dumps(o) for o in orders.values()}) == 1, "a failure is the fallback"
    good = with_returns(make_runtime("lpc-return"), good_curve)
    all_good = run_engine(good, lambda i, c: {"lpc_conversation_id": c}, monkeypatch, steps=200)
    assert all_good.orders != orders["raises"], "the curves changed nothing: no teeth"


def test_a_request_the_models_cannot_read_costs_its_curve_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = return_runtime()
    request = Request("r0", 1, {"lpc_conversation_id": "c"})
    del request.arrival_time  # a vLLM that no longer sets what the features read
    release = runtime.release_for(request)
    assert release.return_curve is None and release.conversation_id == "c"
    stats = runtime.stats.snapshot()
    assert stats["return_curve_errors"] == 1 and stats["releases"] == 1


def test_curve_problems_are_named() -> None:
    assert curve_problem(good_curve(3), GRID) is None
    assert "not a ReturnCurve" in str(curve_problem(None, GRID))
    for bad in ("nan", "rises"):
        assert curve_problem(BAD_CURVES[bad](), GRID) is not None
    assert "increase" in str(curve_problem(BAD_CURVES["other-grid"](), GRID))
    valid_elsewhere = ReturnCurve(np.array([0.0, 2.0]), np.array([1.0, 0.5]))
    assert curve_problem(valid_elsewhere, GRID) is None


# -- reloads, metrics, shadow -------------------------------------------------------------------
def test_a_promoted_return_model_is_swapped_in_and_a_broken_one_is_not(tmp_path: Path) -> None:
    registry = tmp_path / "registry-return"
    registry.mkdir()
    shutil.copytree(SHIPPED_RETURN, registry / "v0001")
    (registry / "current").symlink_to("v0001")
    runtime = return_runtime(return_model=str(registry))
    returns = runtime.access.returns  # type: ignore[union-attr]
    assert returns is not None and returns.model.pointer[0].endswith("v0001")
    (registry / "v0002").mkdir()
    (registry / "v0002" / "metadata.json").write_text("{not json")
    (registry / "current").unlink()
    (registry / "current").symlink_to("v0002")
    returns.check_for_promoted_model()
    returns.check_for_promoted_model()  # the same broken folder: counted once
    assert returns.model.pointer[0].endswith("v0001")
    shutil.copytree(SHIPPED_RETURN, registry / "v0003")
    (registry / "current").unlink()
    (registry / "current").symlink_to("v0003")
    returns.check_for_promoted_model()
    assert returns.model.pointer[0].endswith("v0003")
    stats = runtime.stats.snapshot()
    assert (stats["return_model_reloads"], stats["return_model_reload_failures"]) == (1, 1)


def test_w_is_exported_with_the_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = with_returns(make_runtime("lpc-return"), good_curve)
    run_engine(runtime, lambda i, c: {"lpc_conversation_id": c}, monkeypatch, steps=400)
    snapshot = vllm_plugin.stats_snapshot()  # run_engine registered this runtime
    evictor = runtime.queues.evictor
    assert isinstance(evictor, ReturnWindowEvictor)
    assert snapshot["return_window_seconds"] == evictor.window_s
    assert snapshot["return_rekeys"] == evictor.rekeys > 0
    assert snapshot["return_curves_in_process"] == snapshot["releases"] > 0
    families = {f.name: f for f in _Collector(lambda: snapshot).collect()}
    assert families["vllm:lpc_return_window_seconds"].samples[0].value == evictor.window_s
    assert families["vllm:lpc_return_rekeys"].type == "counter"
    assert families["vllm:lpc_return_rekeys"].samples[0].value == evictor.rekeys
    assert "vllm:lpc_return_curves_in_process" in families
    assert "vllm:lpc_gate_model_trusted" not in families
    line = runtime.stats.summary()
    assert f"return curves {snapshot['return_curves_in_process']} (failed 0" in line


def test_the_shadow_caches_get_each_finished_requests_curve() -> None:
    from tests.integrations.test_shadow import Pool, make_feed, of
    from tests.integrations.test_shadow import Request as ShadowRequest

    feed, _, stats, clock = make_feed(evictor="lpc-return")
    request = ShadowRequest("r", list(range(40)), 24)
    feed.scheduled(request, Pool(64), of("c"))
    request.num_computed_tokens = 40
    request.emit(40)
    request.finished = True
    curve = good_curve(1)
    feed.finished(request, Release(clock(), None, "c", return_curve=curve))
    assert feed.drain(10.0)
    assert feed.caches is not None
    learned = feed.caches.managers["lpc"].evictor
    assert isinstance(learned, ReturnWindowEvictor)
    claims = [run.tag for _, _, _, run in learned._heap]
    assert claims and all(tag[0].curve is curve for tag in claims)
    assert stats.plugin_errors == 0
    feed.close()
