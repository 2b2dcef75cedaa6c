"""The plugin's counters in Prometheus text format, on a port of their own.

vLLM serves its own /metrics from the API server process, but eviction runs in the engine
core process, whose counters that endpoint cannot see; so the plugin serves them itself, on
`LPC_METRICS_PORT` (loopback by default), from the process that owns the KV cache. The
collector reads the counters at scrape time: nothing is done on the eviction hot path.

Every data-parallel rank exports. Each DP engine core is a process of its own with its own
plugin, so each serves on `LPC_METRICS_PORT + rank` (`metrics_port_for`; the rank is the engine
core's, `engine_context`), and every sample carries the label `dp_rank`. Besides the counters:
the trust gate of `lpc-pooled` (`gate_state`: trusted or not, judged labels, the model's and the
constant's mean log-loss), the window W of `lpc-return` in either tier (`window_state`),
histograms of the release latency, of the p releases carry and of cached blocks' age at
eviction (`histograms`), and any numeric `shadow_*` key of the snapshot as a gauge of the same
name (whatever publishes shadow hit ratios only has to put them there).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from lpc.integrations.histograms import HistogramSnapshot

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
    "untrusted_probabilities": "Request-body probabilities ignored as untrusted (not signed)",
    "evictions": "Cached blocks evicted to be reused",
    "cached_blocks_released": "Cached blocks released to the evictor",
    "uncached_blocks_released": "Blocks without a hash released (reused first)",
    "shared_blocks_released": "Cached blocks released while other requests hold them",
    "predictions_in_process": "Releases whose p the in-process access model computed",
    "access_model_reloads": "Promoted access models swapped in",
    "access_model_reload_failures": "Promoted access models that could not be loaded",
    "access_prediction_errors": "Releases the access model could not read (fallback p)",
    "return_curves_in_process": "Releases whose return curve the in-process model computed",
    "return_curve_errors": "Releases the return-time model failed on (fallback score)",
    "invalid_return_curves": "Return curves that were not survival curves (fallback score)",
    "return_model_reloads": "Promoted return-time models swapped in",
    "return_model_reload_failures": "Promoted return-time models that could not be loaded",
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
    "request_log_records_dropped": "Finished requests the request log dropped (queue, disk or id)",
    "request_log_bytes_written": "Bytes written to the request log",
}


# gauge name -> help text: lpc-pooled's trust gate (`gate_state`), when the evictor has one
GATE_GAUGES: dict[str, str] = {
    "gate_model_trusted": "1 while lpc-pooled's trust gate uses the model's p, 0 on the constant",
    "gate_labels_judged": "Releases the trust gate has judged (continued or not)",
    "gate_model_log_loss": "The model's mean log-loss (nats) on the judged releases",
    "gate_constant_log_loss": "The constant's mean log-loss (nats) on the judged releases",
}
# gauge name -> help text: the lpc-return evictor's window (`window_state`), the GPU queue's
# and, with LPCReturnCachePolicy, the CPU tier's
WINDOW_GAUGES: dict[str, str] = {
    "return_window_seconds": "W of lpc-return in the GPU queue: 4 x its measured turnover",
    "return_rekeys": "Re-keyings of lpc-return's queue in the GPU pool",
    "cpu_return_window_seconds": "W of lpc-return in the CPU tier: 4 x its measured turnover",
    "cpu_return_rekeys": "Re-keyings of lpc-return's queue in the CPU tier",
}
# snapshot["histograms"] key -> help text (exported as lpc_<key>)
HISTOGRAMS: dict[str, str] = {
    "release_seconds": "The plugin's work for one request's release (p, features, table)",
    "free_seconds": "KVCacheManager.free of one request: the plugin, vLLM and the LPC queue",
    "release_probability": "The p releases carry (from the request or the model; not fallbacks)",
    "eviction_age_seconds": "Seconds from a cached block's release to its eviction",
}
SHADOW_PREFIX = "shadow_"
RANK_LABEL = "dp_rank"
# Snapshot keys exported under a name and help text of their own; a `shadow_*` key among them
# is not exported a second time by the generic rule.
NAMED_METRICS: tuple[dict[str, str], ...] = (
    COUNTERS,
    REQUEST_LOG_COUNTERS,
    GATE_GAUGES,
    WINDOW_GAUGES,
    SHADOW_COUNTERS,
    SHADOW_GAUGES,
)


def metrics_port_for(port: int, rank: int) -> int:
    """The port a data-parallel rank serves on: `port + rank` (port 0, any free port, stays
    0); a port beyond 65535 is an error naming both."""
    if port == 0:
        return 0
    if port + rank > 65535:
        raise ValueError(
            f"LPC_METRICS_PORT {port} + data-parallel rank {rank} is beyond 65535; "
            "choose a lower LPC_METRICS_PORT"
        )
    return port + rank


def gate_state(evictor: Any) -> dict[str, float]:
    """lpc-pooled's trust gate as gauges (empty for an evictor without one, e.g. `lpc`, or
    one whose gate is off)."""
    trusted = getattr(evictor, "model_trusted", None)
    judged = getattr(evictor, "model_labels_judged", None)
    if not isinstance(trusted, bool) or not isinstance(judged, int):
        return {}
    if getattr(evictor, "model_min_labels", 0) is None:
        return {}  # the gate is off: the model is always used
    per_label = max(judged, 1)
    return {
        "gate_model_trusted": float(trusted),
        "gate_labels_judged": float(judged),
        "gate_model_log_loss": evictor.model_loss_nats / per_label,
        "gate_constant_log_loss": evictor.constant_loss_nats / per_label,
    }


def window_state(evictor: Any, prefix: str = "") -> dict[str, float]:
    """The lpc-return evictor's W (seconds: the multiplier times its measured holding time)
    and its re-keyings as gauges (empty for an evictor without a window)."""
    window_s = getattr(evictor, "window_s", None)
    rekeys = getattr(evictor, "rekeys", None)
    if not isinstance(window_s, float) or not isinstance(rekeys, int):
        return {}
    return {f"{prefix}return_window_seconds": window_s, f"{prefix}return_rekeys": float(rekeys)}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Collector:
    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        data = self._read()
        if not data.get("registered"):
            return
        rank = [str(data.get("dp_rank", 0))]
        labels = [RANK_LABEL]

        def counter(name: str, help_text: str, value: float) -> Any:
            family = CounterMetricFamily(f"lpc_{name}", help_text, labels=labels)
            family.add_metric(rank, value)
            return family

        def gauge(name: str, help_text: str, value: float) -> Any:
            family = GaugeMetricFamily(f"lpc_{name}", help_text, labels=labels)
            family.add_metric(rank, value)
            return family

        for name, help_text in COUNTERS.items():
            yield counter(name, help_text, data.get(name, 0))
        for name, help_text in REQUEST_LOG_COUNTERS.items():
            if name in data:
                yield counter(name, help_text, data[name])
        if "mode" in data:
            mode = GaugeMetricFamily(
                "lpc_mode", "1 for the mode the plugin runs in", labels=["mode", RANK_LABEL]
            )
            for name in MODES:
                mode.add_metric([name, *rank], 1.0 if data["mode"] == name else 0.0)
            yield mode
            yield counter("mode_switches", "Mode switches while running", data["mode_switches"])
        for name, help_text in SHADOW_COUNTERS.items():
            if name in data:
                yield counter(name, help_text, data[name])
        for name, help_text in SHADOW_GAUGES.items():
            if name in data:
                yield gauge(name, help_text, data[name])
        yield gauge(
            "pending_predictions",
            "Predictions asked for and not yet consumed",
            data.get("pending_predictions", 0),
        )
        if "conversations" in data:  # an access-only model runs in process
            yield gauge(
                "conversations", "Conversations in the access model's table", data["conversations"]
            )
        for name, help_text in (*GATE_GAUGES.items(), *WINDOW_GAUGES.items()):
            if name in data:
                yield gauge(name, help_text, data[name])
        named = {name for table in NAMED_METRICS for name in table}
        for name, value in data.items():
            if name.startswith(SHADOW_PREFIX) and _is_number(value) and name not in named:
                yield gauge(name, f"{name} (the stats snapshot's shadow figure)", value)
        histograms: dict[str, Any] = data.get("histograms", {})
        for name, help_text in HISTOGRAMS.items():
            if name not in histograms:
                continue
            snapshot = HistogramSnapshot.of(histograms[name])
            family = HistogramMetricFamily(f"lpc_{name}", help_text, labels=labels)
            buckets = [(_bucket_label(b), c) for b, c in snapshot.cumulative()]
            family.add_metric(rank, buckets, snapshot.total)
            yield family


def _bucket_label(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


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
