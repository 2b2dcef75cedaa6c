"""The plugin's counters: the log line, and the Prometheus endpoint on the loopback."""

from __future__ import annotations

import urllib.request

from lpc.integrations.metrics import COUNTERS, start_metrics_server
from lpc.integrations.stats import PluginStats


def test_counters_add_up_and_summarise() -> None:
    stats = PluginStats()
    stats.add(releases=3, fallbacks_used=2, predictions_used=1)
    stats.add(predictor_failures=1, evictions=5)
    snapshot = stats.snapshot()
    assert snapshot["releases"] == 3 and snapshot["evictions"] == 5
    assert set(COUNTERS) == set(snapshot), "every counter is exported, and only those"
    line = stats.summary()
    assert "3 releases" in line and "fallback 2" in line and "predictor failures 1" in line


def test_prometheus_endpoint_serves_the_counters() -> None:
    stats = PluginStats()
    stats.add(releases=7, evictions=11, predictor_failures=2)

    def read() -> dict:
        return {"registered": True, **stats.snapshot(), "pending_predictions": 4}

    server = start_metrics_server(read, "127.0.0.1", 0)
    assert server is not None
    try:
        port = server.server.server_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.close()
    assert "lpc_releases_total 7.0" in text
    assert "lpc_evictions_total 11.0" in text
    assert "lpc_predictor_failures_total 2.0" in text
    assert "lpc_pending_predictions 4.0" in text


def test_a_taken_port_is_a_warning_not_a_crash() -> None:
    first = start_metrics_server(lambda: {"registered": False}, "127.0.0.1", 0)
    assert first is not None
    try:
        port = first.server.server_port
        assert start_metrics_server(lambda: {"registered": False}, "127.0.0.1", port) is None
    finally:
        first.close()


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
    assert 'lpc_mode{mode="shadow"} 1.0' in text and 'lpc_mode{mode="lpc"} 0.0' in text
    assert "lpc_mode_switches_total 2.0" in text
    assert "lpc_shadow_lpc_hit_ratio 0.4" in text and "lpc_shadow_lru_hit_ratio 0.2" in text
    assert "lpc_shadow_queries_total 40.0" in text and "lpc_shadow_lpc_hits_total 16.0" in text
