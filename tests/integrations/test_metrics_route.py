"""LPC's metrics through vLLM's own `/metrics`: the engine core writes prometheus_client
multiprocess files in `PROMETHEUS_MULTIPROC_DIR`, which vLLM's `/metrics` merges
(`MultiProcessCollector`, as `get_prometheus_registry` builds it); the plugin's own port only
without that route. The same files read by real vLLM's registry: test_metrics_vllm.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from lpc.integrations import metrics
from lpc.integrations.histograms import PluginHistograms
from lpc.integrations.stats import PluginStats


def snapshot(stats: PluginStats, histograms: PluginHistograms, **extra: Any) -> dict[str, Any]:
    return {
        "registered": True,
        **stats.snapshot(),
        "dp_rank": 3,
        "model_name": "qwen",
        "mode": "lpc",
        "mode_switches": 1,
        "memory_bytes": {"gpu_evictor": 4096.0},
        "histograms": {k: v.as_dict() for k, v in histograms.snapshot().items()},
        **extra,
    }


def merged(directory: Path) -> dict[str, Any]:
    """What vLLM's `/metrics` reads from the directory: prometheus_client's own merge."""
    from prometheus_client.multiprocess import MultiProcessCollector

    return {family.name: family for family in MultiProcessCollector(None, str(directory)).collect()}


def value(family: Any, name: str, **labels: str) -> float:
    found = [
        s.value
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (name, labels, family.samples)
    return found[0]


def test_the_files_hold_counters_gauges_and_histograms_as_vllm_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(metrics.MULTIPROC_VARIABLE, str(tmp_path))
    stats, histograms = PluginStats(), PluginHistograms()
    stats.add(releases=5, evictions=2)
    histograms.free_latency_ns.observe(7_000)
    writer = metrics.MultiprocessWriter()
    writer.write(metrics.metric_families(snapshot(stats, histograms)))
    stats.add(releases=2)  # a later flush writes the new totals, never adds them twice
    histograms.free_latency_ns.observe(3_000_000)
    writer.write(metrics.metric_families(snapshot(stats, histograms)))
    families = merged(tmp_path)
    labels = {"model_name": "qwen", "engine": "3"}
    releases = families["vllm:lpc_releases"]
    assert releases.type == "counter"
    assert value(releases, "vllm:lpc_releases_total", **labels) == 7.0
    assert value(families["vllm:lpc_evictions"], "vllm:lpc_evictions_total", **labels) == 2.0
    memory = families["vllm:lpc_memory_bytes"]
    assert memory.type == "gauge"
    assert value(memory, "vllm:lpc_memory_bytes", structure="gpu_evictor", **labels) == 4096.0
    assert "pid" not in memory.samples[0].labels  # mostrecent, as vLLM's own gauges
    mode = families["vllm:lpc_mode"]
    assert value(mode, "vllm:lpc_mode", mode="lpc", **labels) == 1.0
    free = families["vllm:lpc_free_seconds"]
    assert free.type == "histogram"
    assert value(free, "vllm:lpc_free_seconds_bucket", le="1e-05", **labels) == 1.0
    assert value(free, "vllm:lpc_free_seconds_bucket", le="+Inf", **labels) == 2.0
    assert value(free, "vllm:lpc_free_seconds_count", **labels) == 2.0
    assert value(free, "vllm:lpc_free_seconds_sum", **labels) == pytest.approx(3.007e-3)


def test_two_engines_are_told_apart_by_their_engine_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(metrics.MULTIPROC_VARIABLE, str(tmp_path))
    writer = metrics.MultiprocessWriter()
    for rank, releases in ((0, 4), (1, 6)):
        stats = PluginStats()
        stats.add(releases=releases)
        data = snapshot(stats, PluginHistograms(), dp_rank=rank)
        writer.write(metrics.metric_families(data))
    family = merged(tmp_path)["vllm:lpc_releases"]
    assert value(family, "vllm:lpc_releases_total", engine="0") == 4.0
    assert value(family, "vllm:lpc_releases_total", engine="1") == 6.0


def test_the_route_is_vllms_metrics_when_it_reads_multiprocess_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With `PROMETHEUS_MULTIPROC_DIR` the engine core flushes there (and at close) and opens
    no port even if one is configured; without it, the configured port; with neither, one
    line says how to get them."""
    monkeypatch.setenv(metrics.MULTIPROC_VARIABLE, str(tmp_path))
    stats = PluginStats()
    served = []
    monkeypatch.setattr(metrics, "start_metrics_server", lambda *args: served.append(args))
    caplog.set_level(logging.INFO, "vllm.plugins.lpc")
    export = metrics.start_export(
        lambda: snapshot(stats, PluginHistograms()), "127.0.0.1", 9476, 3, interval_s=3600.0
    )
    assert isinstance(export, metrics.MetricsFlusher) and served == []
    assert "metrics_port 9476 is not opened" in caplog.text
    assert value(merged(tmp_path)["vllm:lpc_releases"], "vllm:lpc_releases_total") == 0.0
    stats.add(releases=9)
    export.close()  # the last flush
    assert value(merged(tmp_path)["vllm:lpc_releases"], "vllm:lpc_releases_total") == 9.0

    no_route: dict[str, str] = {}
    metrics.start_export(dict, "127.0.0.1", 9476, 3, environ=no_route)
    assert served == [(dict, "127.0.0.1", 9479)]  # the fallback: port + rank
    caplog.clear()
    assert metrics.start_export(dict, "127.0.0.1", None, 0, environ=no_route) is None
    assert "PROMETHEUS_MULTIPROC_DIR" in caplog.text and "metrics_port" in caplog.text
    missing = {metrics.MULTIPROC_VARIABLE: str(tmp_path / "absent")}
    assert metrics.start_export(dict, "127.0.0.1", None, 0, environ=missing) is None
    assert "is not a directory" in caplog.text


def test_a_failing_flush_is_logged_once_and_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(metrics.MULTIPROC_VARIABLE, str(tmp_path))
    calls = [0]

    def read() -> dict[str, Any]:
        calls[0] += 1
        if calls[0] <= 2:
            raise RuntimeError("snapshot failed")
        return snapshot(PluginStats(), PluginHistograms())

    flusher = metrics.MetricsFlusher(read, metrics.MultiprocessWriter(), 3600.0)
    assert flusher.flush() is False and flusher.flush() is False
    assert caplog.text.count("could not be written") == 1
    assert flusher.flush() is True
    assert "vllm:lpc_releases" in merged(tmp_path)
