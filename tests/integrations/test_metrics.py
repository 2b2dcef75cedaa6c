"""The plugin's metrics: the counters' log line, the Prometheus endpoint on the loopback, every
data-parallel rank on its own port with its rank label, lpc-pooled's trust gate, the
histograms (release latency, p, eviction age) and generic `shadow_*` gauges."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import pytest

from eviction import PooledLPCEvictor, Release
from eviction.base import FreedBlocks
from lpc.integrations import vllm_plugin
from lpc.integrations.config import PluginConfig
from lpc.integrations.engine_context import (
    EngineContext,
    engine_context,
    rank_of_config,
    rank_of_process_name,
)
from lpc.integrations.histograms import Histogram, PluginHistograms
from lpc.integrations.metrics import (
    COUNTERS,
    gate_state,
    metrics_port_for,
    start_metrics_server,
)
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_plugin import PluginRuntime
from lpc.integrations.vllm_queue import QueueRuntime, bind_queue_class


def scrape(read: Any) -> str:
    server = start_metrics_server(read, "127.0.0.1", 0)
    assert server is not None
    try:
        port = server.server.server_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return response.read().decode()
    finally:
        server.close()


def test_counters_add_up_and_summarise() -> None:
    stats = PluginStats()
    stats.add(releases=3, fallbacks_used=2, predictions_used=1)
    stats.add(predictor_failures=1, evictions=5)
    snapshot = stats.snapshot()
    assert snapshot["releases"] == 3 and snapshot["evictions"] == 5
    assert set(COUNTERS) == set(snapshot), "every counter is exported, and only those"
    line = stats.summary()
    assert "3 releases" in line and "fallback 2" in line and "predictor failures 1" in line


def test_prometheus_endpoint_serves_the_counters_with_the_rank() -> None:
    stats = PluginStats()
    stats.add(releases=7, evictions=11, predictor_failures=2, fallbacks_used=3, plugin_errors=1)
    text = scrape(
        lambda: {"registered": True, **stats.snapshot(), "pending_predictions": 4, "dp_rank": 2}
    )
    assert 'lpc_releases_total{dp_rank="2"} 7.0' in text
    assert 'lpc_evictions_total{dp_rank="2"} 11.0' in text
    assert 'lpc_predictor_failures_total{dp_rank="2"} 2.0' in text
    assert 'lpc_fallbacks_used_total{dp_rank="2"} 3.0' in text
    assert 'lpc_plugin_errors_total{dp_rank="2"} 1.0' in text  # caught faults
    assert 'lpc_pending_predictions{dp_rank="2"} 4.0' in text


def test_a_taken_port_is_a_warning_not_a_crash() -> None:
    first = start_metrics_server(lambda: {"registered": False}, "127.0.0.1", 0)
    assert first is not None
    try:
        port = first.server.server_port
        assert start_metrics_server(lambda: {"registered": False}, "127.0.0.1", port) is None
    finally:
        first.close()


# -- every data-parallel rank -------------------------------------------------------------------
@dataclass
class FakeParallelConfig:
    data_parallel_rank: int = 0  # vLLM resets it to 0 for a dense model's independent ranks
    data_parallel_index: int = 0


@dataclass
class FakeVllmConfig:
    parallel_config: FakeParallelConfig = field(default_factory=FakeParallelConfig)


class FakeBlockPool:
    """Builds its free queue in its constructor, as vLLM's `BlockPool` does."""

    def __init__(self, queue_class: type, num_blocks: int, hash_block_size: int) -> None:
        self.hash_block_size = hash_block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_queue = queue_class(self.blocks)


class FakeScheduler:
    """Builds the pool in its constructor and holds the engine's config, as vLLM's does."""

    def __init__(self, vllm_config: FakeVllmConfig, queue_class: type) -> None:
        self.vllm_config = vllm_config
        self.pool = FakeBlockPool(queue_class, 8, hash_block_size=16)


@dataclass
class Block:
    block_id: int
    block_hash: bytes | None = None
    block_hash_num_tokens: int | None = None


def test_the_engine_context_comes_from_the_scheduler_building_the_queue() -> None:
    queues = QueueRuntime(PluginConfig(), PluginStats())
    config = FakeVllmConfig(FakeParallelConfig(data_parallel_rank=0, data_parallel_index=3))
    FakeScheduler(config, bind_queue_class(queues))
    assert queues.engine == EngineContext(16, 3, "config")


def test_the_rank_falls_back_to_the_process_name_then_to_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert rank_of_config(FakeVllmConfig(FakeParallelConfig(1, 5))) == 5
    assert rank_of_config(object()) is None
    assert rank_of_process_name("EngineCore_DP3") == 3
    assert rank_of_process_name("DPEngineCoreActor_DP12") == 12
    assert rank_of_process_name("EngineCore") is None
    assert engine_context() == EngineContext(None, 0, "default")  # a test: no engine above
    import multiprocessing

    process = multiprocessing.current_process()
    monkeypatch.setattr(process, "name", "EngineCore_DP2")
    assert engine_context() == EngineContext(None, 2, "process name")


def test_each_rank_serves_on_its_own_port(monkeypatch: pytest.MonkeyPatch) -> None:
    assert metrics_port_for(9476, 0) == 9476 and metrics_port_for(9476, 3) == 9479
    assert metrics_port_for(0, 5) == 0  # any free port
    with pytest.raises(ValueError, match="65535"):
        metrics_port_for(65535, 1)
    started = []
    monkeypatch.setattr(
        vllm_plugin, "start_metrics_server", lambda read, host, port: started.append(port)
    )
    runtime = make_runtime(PluginConfig(metrics_port=9476))
    runtime.queues.engine = EngineContext(16, 2, "config")
    vllm_plugin._activate(vllm_plugin._Registration(runtime, []))
    assert started == [9478]


# -- the trust gate, the histograms, shadow figures ---------------------------------------------
def make_runtime(config: PluginConfig | None = None, clock: Any = None) -> PluginRuntime:
    config = config or PluginConfig(trust_request_hints=True)
    stats = PluginStats()
    queues = QueueRuntime(config, stats, clock or (lambda: 0.0))
    return PluginRuntime(config, stats, queues, None, None)


def test_the_trust_gate_is_exported() -> None:
    evictor = PooledLPCEvictor(8, horizon_s=10.0, model_min_labels=2)
    assert gate_state(evictor)["gate_model_trusted"] == 0.0
    # Conversation a returns within the horizon, b does not; the model said so.
    for t, conversation, p in [(0, "a", 0.9), (1, "b", 0.1), (5, "a", 0.9), (30, "c", 0.5)]:
        evictor.push_cached(FreedBlocks([t % 8], [16], [None]), Release(t, p, conversation))
    state = gate_state(evictor)
    assert state["gate_labels_judged"] == 3.0 and state["gate_model_trusted"] == 1.0
    assert state["gate_model_log_loss"] < state["gate_constant_log_loss"]
    assert gate_state(PooledLPCEvictor(8, model_min_labels=None)) == {}  # gate off
    text = scrape(lambda: {"registered": True, **state})
    assert 'lpc_gate_model_trusted{dp_rank="0"} 1.0' in text
    assert 'lpc_gate_labels_judged{dp_rank="0"} 3.0' in text


def test_shadow_figures_are_exported_as_gauges() -> None:
    snapshot = {
        "registered": True,
        "shadow_lru_hit_ratio": 0.25,
        "shadow_lpc_hit_ratio": 0.31,
        "shadow_note": "not a number",
        "shadow_flag": True,
    }
    text = scrape(lambda: snapshot)
    assert 'lpc_shadow_lru_hit_ratio{dp_rank="0"} 0.25' in text
    assert 'lpc_shadow_lpc_hit_ratio{dp_rank="0"} 0.31' in text
    assert "shadow_note" not in text and "shadow_flag" not in text


@dataclass
class Params:
    extra_args: dict[str, Any] | None = None


@dataclass
class Request:
    request_id: str
    sampling_params: Params = field(default_factory=Params)
    num_prompt_tokens: int = 12


def test_every_release_is_timed_and_its_p_counted() -> None:
    runtime = make_runtime()
    for i, p in enumerate([0.12, 0.5, 0.97, None]):
        extra = {} if p is None else {"lpc_probability": p}
        runtime.safe_release_for(Request(f"r{i}", Params(extra)))
    runtime.safe_release_for(object())  # no request_id: a caught fault
    histograms = runtime.queues.histograms.snapshot()
    latency = histograms["release_seconds"]
    assert latency.count == 5 and latency.total > 0  # the failed release too
    assert latency.bounds[0] == 1e-06 and latency.cumulative()[-1] == (float("inf"), 5)
    p = histograms["release_probability"]
    assert p.count == 3  # fallbacks are counted by fallbacks_used, not here
    assert dict(p.cumulative())[0.15] == 1 and dict(p.cumulative())[0.5] == 2
    assert runtime.stats.plugin_errors == 1


def test_eviction_age_is_the_time_from_release_to_eviction() -> None:
    now = [0.0]
    config = PluginConfig(evictor="lpc")
    queues = QueueRuntime(config, PluginStats(), lambda: now[0])
    blocks = [Block(i) for i in range(6)]
    queue = bind_queue_class(queues)(blocks)
    queue.popleft_n(6)
    for block in blocks:
        block.block_hash = bytes([block.block_id])
        block.block_hash_num_tokens = 16
    now[0] = 10.0
    with queues.releasing(Release(10.0, 0.5, "a")):
        queue.append_n(blocks[:4])
    now[0] = 20.0
    with queues.releasing(Release(20.0, 0.5, "b")):
        queue.append_n(blocks[4:])
    now[0] = 70.0
    queue.popleft_n(5)  # four blocks 60 s old, one 50 s old
    queue.popleft()  # 50 s old
    age = queues.histograms.snapshot()["eviction_age_seconds"]
    assert age.count == 6 and age.total == pytest.approx(4 * 60 + 2 * 50)
    assert dict(age.cumulative())[30] == 0 and dict(age.cumulative())[60] == 6


def test_histograms_are_served_in_seconds() -> None:
    histograms = PluginHistograms()
    histograms.release_latency_ns.observe(7_000)
    histograms.eviction_age_s.observe_n(100.0, 3)
    snapshot = {k: v.as_dict() for k, v in histograms.snapshot().items()}
    assert json.loads(json.dumps(snapshot)) == snapshot  # stats_snapshot stays JSON
    text = scrape(lambda: {"registered": True, "histograms": snapshot})
    assert 'lpc_release_seconds_bucket{dp_rank="0",le="5e-06"} 0.0' in text
    assert 'lpc_release_seconds_bucket{dp_rank="0",le="1e-05"} 1.0' in text
    assert 'lpc_release_seconds_count{dp_rank="0"} 1.0' in text
    assert 'lpc_eviction_age_seconds_bucket{dp_rank="0",le="120.0"} 3.0' in text
    assert 'lpc_release_probability_count{dp_rank="0"} 0.0' in text


def test_histogram_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="ascending"):
        Histogram([2, 1])
    with pytest.raises(ValueError, match="ascending"):
        Histogram([])


def test_the_snapshot_carries_rank_gate_and_histograms(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = make_runtime(PluginConfig(evictor="lpc-pooled"))
    queue = bind_queue_class(runtime.queues)([Block(i) for i in range(4)])
    runtime.queues.engine = EngineContext(16, 1, "config")
    monkeypatch.setattr(vllm_plugin, "_REGISTRATION", vllm_plugin._Registration(runtime, []))
    snapshot = vllm_plugin.stats_snapshot()
    assert snapshot["dp_rank"] == 1
    assert snapshot["gate_model_trusted"] == 0.0 and snapshot["gate_labels_judged"] == 0.0
    assert set(snapshot["histograms"]) == {
        "release_seconds",
        "free_seconds",
        "release_probability",
        "eviction_age_seconds",
    }
    assert queue.evictor is runtime.queues.evictor


def test_the_mode_and_the_shadow_figures_are_exported() -> None:
    def read() -> dict:
        return {
            "registered": True,
            "mode": "shadow",
            "mode_switches": 2,
            "shadow_requests": 3,
            "shadow_queries": 40,
            "shadow_lpc_hits": 16,
            "shadow_lru_hits": 8,
            "shadow_lpc_hit_ratio": 0.4,
            "shadow_lru_hit_ratio": 0.2,
            "shadow_events_pending": 0,
        }

    server = start_metrics_server(read, "127.0.0.1", 0)
    assert server is not None
    try:
        port = server.server.server_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.close()
    assert 'lpc_mode{dp_rank="0",mode="shadow"} 1.0' in text
    assert 'lpc_mode{dp_rank="0",mode="lpc"} 0.0' in text
    assert 'lpc_mode_switches_total{dp_rank="0"} 2.0' in text
    assert 'lpc_shadow_lpc_hit_ratio{dp_rank="0"} 0.4' in text
    assert 'lpc_shadow_lru_hit_ratio{dp_rank="0"} 0.2' in text
    assert 'lpc_shadow_queries_total{dp_rank="0"} 40.0' in text
    assert 'lpc_shadow_lpc_hits_total{dp_rank="0"} 16.0' in text
    assert text.count("lpc_shadow_lpc_hit_ratio{") == 1  # named, not exported twice
