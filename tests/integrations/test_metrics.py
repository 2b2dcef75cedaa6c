"""The plugin's metrics: the counters' log line, vLLM's names and labels (`vllm:lpc_*`,
`model_name`, `engine`), counters as counters, the fallback endpoint on the loopback with
every data-parallel rank on its own port, lpc-pooled's trust gate, the histograms (release
latency, p, eviction age), generic `shadow_*` gauges, and the memory of LPC's structures.
vLLM's `/metrics` route (multiprocess files) is in test_metrics_route.py."""

from __future__ import annotations

import json
import socketserver
import urllib.request
from dataclasses import dataclass, field
from functools import partialmethod
from typing import Any

import pytest

from eviction import PooledLPCEvictor, Release
from eviction.base import FreedBlocks
from lpc.integrations import metrics, vllm_plugin
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


@pytest.fixture(autouse=True)
def quick_server_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    """prometheus_client serves with `serve_forever`'s default 0.5 s poll, so each `close()`
    (its `shutdown()`) waits up to 0.5 s for the loop to look; poll faster here. What is
    served is the same."""
    serve_forever = socketserver.BaseServer.serve_forever
    monkeypatch.setattr(
        socketserver.BaseServer, "serve_forever", partialmethod(serve_forever, poll_interval=0.01)
    )


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
        lambda: {
            "registered": True,
            **stats.snapshot(),
            "pending_predictions": 4,
            "dp_rank": 2,
            "model_name": "qwen",
        }
    )
    labels = '{engine="2",model_name="qwen"}'
    assert f"vllm:lpc_releases_total{labels} 7.0" in text
    assert f"vllm:lpc_evictions_total{labels} 11.0" in text
    assert f"vllm:lpc_predictor_failures_total{labels} 2.0" in text
    assert f"vllm:lpc_fallbacks_used_total{labels} 3.0" in text
    assert f"vllm:lpc_plugin_errors_total{labels} 1.0" in text  # caught faults
    assert f"vllm:lpc_pending_predictions{labels} 4.0" in text


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
        self.blocks = [Block(i, pool=self) for i in range(num_blocks)]
        self.free_block_queue = queue_class(self.blocks)


@dataclass
class Block:
    block_id: int
    block_hash: bytes | None = None
    block_hash_num_tokens: int | None = None
    pool: Any = None  # vLLM 0.33's blocks know their pool


def test_the_engine_context_comes_from_the_pool_and_the_schedulers_config() -> None:
    queues = QueueRuntime(PluginConfig(), PluginStats())
    # What the plugin's scheduler hook records before vLLM builds the scheduler's pool.
    queues.vllm_config = FakeVllmConfig(
        FakeParallelConfig(data_parallel_rank=0, data_parallel_index=3)
    )
    FakeBlockPool(bind_queue_class(queues), 8, hash_block_size=16)
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
        metrics, "start_metrics_server", lambda read, host, port: started.append(port)
    )
    monkeypatch.delenv(metrics.MULTIPROC_VARIABLE, raising=False)  # no vLLM route: the port
    runtime = make_runtime(PluginConfig(metrics_port=9476))
    runtime.queues.engine = EngineContext(16, 2, "config")
    vllm_plugin._activate(vllm_plugin._Registration(runtime))
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
    assert 'vllm:lpc_gate_model_trusted{engine="0",model_name=""} 1.0' in text
    assert 'vllm:lpc_gate_labels_judged_total{engine="0",model_name=""} 3.0' in text


def test_shadow_figures_are_exported_as_gauges() -> None:
    snapshot = {
        "registered": True,
        "shadow_lru_hit_ratio": 0.25,
        "shadow_lpc_hit_ratio": 0.31,
        "shadow_note": "not a number",
        "shadow_flag": True,
    }
    text = scrape(lambda: snapshot)
    assert 'vllm:lpc_shadow_lru_hit_ratio{engine="0",model_name=""} 0.25' in text
    assert 'vllm:lpc_shadow_lpc_hit_ratio{engine="0",model_name=""} 0.31' in text
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
    # The exposition sorts labels by name.
    assert 'vllm:lpc_release_seconds_bucket{engine="0",le="5e-06",model_name=""} 0.0' in text
    assert 'vllm:lpc_release_seconds_bucket{engine="0",le="1e-05",model_name=""} 1.0' in text
    assert 'vllm:lpc_release_seconds_count{engine="0",model_name=""} 1.0' in text
    assert 'vllm:lpc_eviction_age_seconds_bucket{engine="0",le="120.0",model_name=""} 3.0' in text
    assert 'vllm:lpc_release_probability_count{engine="0",model_name=""} 0.0' in text


def test_histogram_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="ascending"):
        Histogram([2, 1])
    with pytest.raises(ValueError, match="ascending"):
        Histogram([])


def test_the_snapshot_carries_rank_gate_and_histograms(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = make_runtime(PluginConfig(evictor="lpc-pooled"))
    queue = bind_queue_class(runtime.queues)([Block(i) for i in range(4)])
    runtime.queues.engine = EngineContext(16, 1, "config")
    monkeypatch.setattr(vllm_plugin, "_REGISTRATION", vllm_plugin._Registration(runtime))
    snapshot = vllm_plugin.stats_snapshot()
    assert snapshot["dp_rank"] == 1
    assert snapshot["gate_model_trusted"] == 0.0 and snapshot["gate_labels_judged"] == 0.0
    assert set(snapshot["histograms"]) == {
        "release_seconds",
        "free_seconds",
        "scoring_seconds",
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
    labels = 'engine="0",model_name=""'
    assert 'vllm:lpc_mode{engine="0",mode="shadow",model_name=""} 1.0' in text
    assert 'vllm:lpc_mode{engine="0",mode="lpc",model_name=""} 0.0' in text
    assert f"vllm:lpc_mode_switches_total{{{labels}}} 2.0" in text
    assert f"vllm:lpc_shadow_lpc_hit_ratio{{{labels}}} 0.4" in text
    assert f"vllm:lpc_shadow_lru_hit_ratio{{{labels}}} 0.2" in text
    assert f"vllm:lpc_shadow_queries_total{{{labels}}} 40.0" in text
    assert f"vllm:lpc_shadow_lpc_hits_total{{{labels}}} 16.0" in text
    assert text.count("vllm:lpc_shadow_lpc_hit_ratio{") == 1  # named, not exported twice


# -- vLLM's names and labels, counters as counters, LPC's memory ------------------------------
def render(read: Any) -> str:
    """The exposition text of the plugin's families, without a server."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics._Collector(read))
    return generate_latest(registry).decode()


def families_of(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name: family for family in text_string_to_metric_families(text)}


def test_names_labels_and_types_follow_vllms() -> None:
    """Every family is `vllm:lpc_<snake case>`; every sample carries vLLM's `model_name` and
    `engine` labels; everything that only grows is a counter (`_total`), including the trust
    gate's judged labels and lpc-return's re-keyings, which were gauges."""
    stats = PluginStats()
    stats.add(releases=3)
    snapshot = {
        "registered": True,
        **stats.snapshot(),
        "dp_rank": 1,
        "model_name": "Qwen/Qwen3-8B",
        "mode": "lpc",
        "mode_switches": 0,
        "gate_model_trusted": 1.0,
        "gate_labels_judged": 5.0,
        "return_window_seconds": 30.0,
        "return_rekeys": 4.0,
        "cpu_return_rekeys": 2.0,
        "request_log_records_written": 9,
        "memory_bytes": {"gpu_evictor": 1024.0},
        "histograms": {k: v.as_dict() for k, v in PluginHistograms().snapshot().items()},
    }
    families = families_of(render(lambda: snapshot))
    counters = {
        *metrics.COUNTERS,
        *metrics.GATE_COUNTERS,
        *metrics.WINDOW_COUNTERS,
        "request_log_records_written",
        "mode_switches",
    }
    for name in counters:
        assert families[f"vllm:lpc_{name}"].type == "counter", name
    for name in ("gate_model_trusted", "return_window_seconds", "memory_bytes", "mode"):
        assert families[f"vllm:lpc_{name}"].type == "gauge", name
    assert families["vllm:lpc_free_seconds"].type == "histogram"
    assert families["vllm:lpc_releases"].samples[0].name == "vllm:lpc_releases_total"
    for name, family in families.items():
        assert name.startswith("vllm:lpc_") and name[5:] == name[5:].lower(), name
        for sample in family.samples:
            assert sample.labels["model_name"] == "Qwen/Qwen3-8B", sample
            assert sample.labels["engine"] == "1", sample
            assert "dp_rank" not in sample.labels


def test_the_model_name_is_vllms_served_model_name() -> None:
    @dataclass
    class ModelConfig:
        model: str = "/models/qwen"
        served_model_name: Any = None

    @dataclass
    class Config:
        model_config: ModelConfig = field(default_factory=ModelConfig)

    assert metrics.model_name_of(Config(ModelConfig(served_model_name="qwen"))) == "qwen"
    assert metrics.model_name_of(Config(ModelConfig(served_model_name=["a", "b"]))) == "a"
    assert metrics.model_name_of(Config()) == "/models/qwen"  # vLLM's own fallback
    assert metrics.model_name_of(object()) == ""


def snapshot_of(runtime: PluginRuntime, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr(vllm_plugin, "_REGISTRATION", vllm_plugin._Registration(runtime))
    return vllm_plugin.stats_snapshot()


def test_the_memory_of_lpcs_structures_is_exported_and_follows_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`vllm:lpc_memory_bytes{structure=...}` is above 0 and grows with the structures: a
    larger pool's evictor, more requests' state."""
    runtime = make_runtime(PluginConfig(evictor="lpc-pooled"))
    runtime.model_name = "m"
    bind_queue_class(runtime.queues)([Block(i) for i in range(64)])
    small = snapshot_of(runtime, monkeypatch)["memory_bytes"]
    assert small["gpu_evictor"] > 0 and small["requests"] > 0
    bind_queue_class(runtime.queues)([Block(i) for i in range(8192)])  # a larger pool
    for i in range(500):
        runtime.deferred_releases[i] = Release(float(i), 0.5, f"conversation-{i}")
    snapshot = snapshot_of(runtime, monkeypatch)
    large = snapshot["memory_bytes"]
    assert large["gpu_evictor"] > 10 * small["gpu_evictor"]
    assert large["requests"] > small["requests"] + 500 * 50  # a Release is more than 50 bytes
    family = families_of(render(lambda: snapshot))["vllm:lpc_memory_bytes"]
    exported = {s.labels["structure"]: s.value for s in family.samples}
    assert exported["gpu_evictor"] == large["gpu_evictor"]
    assert all(s.labels["model_name"] == "m" for s in family.samples)


class Foreign:
    """Stands for vLLM's objects (a `KVCacheBlock`): not LPC's memory."""

    def __init__(self) -> None:
        self.payload = [float(i) for i in range(100)]


def test_the_memory_estimate_counts_ours_once_and_not_vllms() -> None:
    floats = [float(i) + 0.5 for i in range(10_000)]
    assert metrics.estimate_bytes(floats) >= 10_000 * (8 + 24)  # pointers and float objects
    shared = [-1] * 10_000  # the interpreter's own small ints: only the pointers
    assert metrics.estimate_bytes(shared) < 10_000 * 8 + 100
    foreign = [Foreign() for _ in range(100)]
    assert metrics.estimate_bytes(foreign) < 100 * 8 + 200  # the list, not vLLM's objects
    seen: set[int] = set()
    first = metrics.estimate_bytes(floats, seen)
    assert metrics.estimate_bytes(floats, seen) == 0 < first  # shared structures count once


def test_the_memory_estimate_costs_the_same_whatever_the_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured at scrape time in constant work: the same number of objects sized for a
    container of 100 and of 20,000 elements (a sample, scaled)."""
    import sys as real_sys

    calls = [0]

    class CountingSys:
        @staticmethod
        def getsizeof(value: object, default: int = 0) -> int:
            calls[0] += 1
            return real_sys.getsizeof(value, default)

    monkeypatch.setattr(metrics, "sys", CountingSys)
    counts = []
    for n in (100, 20_000):
        calls[0] = 0
        metrics.estimate_bytes({i: [float(i)] for i in range(n)})
        counts.append(calls[0])
    assert counts[0] == counts[1]
