"""The plugin's counters in Prometheus text format, on a port of their own.

vLLM serves its own /metrics from the API server process, but eviction runs in the engine
core process, whose counters that endpoint cannot see; so the plugin serves them itself, on
`LPC_METRICS_PORT` (loopback by default), from the process that owns the KV cache. The
collector reads the counters at scrape time: nothing is done on the eviction hot path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("vllm.plugins.lpc")

# counter name -> help text (exported as lpc_<name>_total)
COUNTERS: dict[str, str] = {
    "releases": "Requests that released their KV blocks",
    "probabilities_from_request": "Releases whose probability the request carried",
    "predictions_used": "Releases that used an asynchronous prediction",
    "fallbacks_used": "Releases that used the fallback probability",
    "predictions_requested": "Predictions asked of the predictor",
    "predictions_answered": "Predictions the predictor answered",
    "predictions_late": "Predictions not back when their request released its blocks",
    "predictions_dropped": "Predictions not asked because too many were pending",
    "predictor_calls": "Batched calls to the predictor",
    "predictor_failures": "Predictor calls that failed (error, timeout, overload)",
    "invalid_hints": "Requests whose LPC fields were malformed and ignored",
    "evictions": "Cached blocks evicted to be reused",
    "cached_blocks_released": "Cached blocks released to the evictor",
    "uncached_blocks_released": "Blocks without a hash released (reused first)",
    "shared_blocks_released": "Cached blocks released while other requests hold them",
    "predictions_in_process": "Releases whose p the in-process access model computed",
    "access_model_reloads": "Promoted access models swapped in",
    "access_model_reload_failures": "Promoted access models that could not be loaded",
    "access_prediction_errors": "Releases the access model could not read (fallback p)",
    "invalid_probabilities": "Probabilities not finite or not in [0, 1] (fallback p used)",
    "plugin_errors": "Exceptions caught in the plugin's hooks (vLLM's own behaviour used)",
    "preemptions": "Requests that released their blocks unfinished (preempted)",
    "protected_blocks_released": "Cached blocks of preempted requests, queued after all others",
}
# Exported once shadow mode was entered (`shadow`): since it last started.
SHADOW_COUNTERS: dict[str, str] = {
    "shadow_requests": "Requests the shadow caches admitted (first scheduling)",
    "shadow_queries": "Tokens the shadow caches looked up (prefix_cache_queries' unit)",
    "shadow_lpc_hits": "Tokens the shadow LPC cache hit",
    "shadow_lru_hits": "Tokens the shadow LRU cache hit",
}
SHADOW_GAUGES: dict[str, str] = {
    "shadow_lpc_hit_ratio": "Token hit ratio LPC would have on this traffic (shadow)",
    "shadow_lru_hit_ratio": "Token hit ratio LRU would have on this traffic (shadow)",
    "shadow_events_pending": "Shadow events queued and not applied yet",
}
MODES = ("lpc", "lru", "shadow")
# Exported only when the request log is on (`request_log_dir`).
REQUEST_LOG_COUNTERS: dict[str, str] = {
    "request_log_records_written": "Finished requests written to the request log",
    "request_log_records_dropped": "Finished requests the request log dropped (queue or disk)",
    "request_log_bytes_written": "Bytes written to the request log",
}


class _Collector:
    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        data = self._read()
        if not data.get("registered"):
            return
        for name, help_text in COUNTERS.items():
            yield CounterMetricFamily(f"lpc_{name}", help_text, value=data.get(name, 0))
        for name, help_text in REQUEST_LOG_COUNTERS.items():
            if name in data:
                yield CounterMetricFamily(f"lpc_{name}", help_text, value=data[name])
        if "mode" in data:
            mode = GaugeMetricFamily(
                "lpc_mode", "1 for the mode the plugin runs in", labels=["mode"]
            )
            for name in MODES:
                mode.add_metric([name], 1.0 if data["mode"] == name else 0.0)
            yield mode
            yield CounterMetricFamily(
                "lpc_mode_switches", "Mode switches while running", value=data["mode_switches"]
            )
        for name, help_text in SHADOW_COUNTERS.items():
            if name in data:
                yield CounterMetricFamily(f"lpc_{name}", help_text, value=data[name])
        for name, help_text in SHADOW_GAUGES.items():
            if name in data:
                yield GaugeMetricFamily(f"lpc_{name}", help_text, value=data[name])
        yield GaugeMetricFamily(
            "lpc_pending_predictions",
            "Predictions asked for and not yet consumed",
            value=data.get("pending_predictions", 0),
        )
        if "conversations" in data:  # an access-only model runs in process
            yield GaugeMetricFamily(
                "lpc_conversations",
                "Conversations in the access model's table",
                value=data["conversations"],
            )


@dataclass
class MetricsServer:
    server: Any
    thread: Any

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_metrics_server(
    read: Callable[[], dict[str, Any]], host: str, port: int
) -> MetricsServer | None:
    """Serve the counters on host:port; None (with a warning) when the port is taken."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as error:
        raise RuntimeError(
            f"LPC_METRICS_PORT is set but prometheus_client is not installed ({error})"
        ) from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(read))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        logger.warning("LPC metrics not served on %s:%d: %s", host, port, error)
        return None
    logger.info("LPC metrics served at http://%s:%d/metrics", host, port)
    return MetricsServer(server, thread)
