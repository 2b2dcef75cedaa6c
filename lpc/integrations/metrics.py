"""The plugin's metrics in vLLM's own `/metrics`, named and labelled as vLLM names its own.

The families are built once, from the plugin's snapshot at scrape or flush time
(`metric_families`): nothing is done on the eviction hot path. `start_export` picks the route:
with `PROMETHEUS_MULTIPROC_DIR` set, the engine core writes them as prometheus_client
multiprocess files that vLLM's API server reads (`MultiprocessWriter`, flushed every
`FLUSH_INTERVAL_S` by `MetricsFlusher`); else it serves them on the plugin's own port
(`metrics_port` + the engine's rank); with neither, one line at start-up says how to get them.

Why this route, the names and what is exported: docs/design.md, "Metrics through vLLM's
/metrics".
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from lpc.integrations.histograms import HistogramSnapshot

logger = logging.getLogger("vllm.plugins.lpc")

PREFIX = "vllm:lpc_"
# vLLM's own label names (`PrometheusStatLogger`: ["model_name", "engine"]).
MODEL_LABEL = "model_name"
ENGINE_LABEL = "engine"
MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
FLUSH_INTERVAL_S = 1.0  # how often the engine core writes its families for vLLM's /metrics

# counter name -> help text (exported as vllm:lpc_<name>_total)
COUNTERS: dict[str, str] = {
    "releases": "Requests that released their KV blocks",
    "probabilities_from_request": "Releases whose probability the request carried",
    "predictions_used": "Releases that used an asynchronous prediction",
    "fallbacks_used": "Releases that used the fallback probability",
    "predictions_requested": "Predictions asked of the predictor",
    "predictions_answered": "Predictions the predictor answered",
    "predictions_late": "Predictions not back when their request released its blocks",
    "late_predictions_used": "Releases re-keyed in a free queue by a prediction that came late",
    "late_runs_rekeyed": "Runs of blocks re-keyed by predictions that came late",
    "predictions_dropped": "Predictions not asked because too many were pending",
    "predictor_calls": "Batched calls to the predictor",
    "predictor_failures": "Predictor calls that failed (error, timeout, overload)",
    "invalid_hints": "Requests whose LPC fields were malformed and ignored",
    "untrusted_probabilities": "Request-body probabilities ignored as untrusted (not signed)",
    "pinned_share_capped": "Trusted-hint releases keyed at the fallback p: tenant's pinned cap",
    "evictions": "Cached blocks evicted to be reused",
    "cached_blocks_released": "Cached blocks released to the evictor",
    "uncached_blocks_released": "Blocks without a hash released (reused first)",
    "shared_blocks_released": "Cached blocks released while other requests hold them",
    "predictions_in_process": "Releases whose p the in-process access model computed",
    "in_process_scoring_calls": "Forward passes of the in-process access model",
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
# lpc-pooled's trust gate (`gate_state`), when the evictor has one: gauges and one counter
GATE_GAUGES: dict[str, str] = {
    "gate_model_trusted": "1 while lpc-pooled's trust gate uses the model's p, 0 on the constant",
    "gate_model_log_loss": "The model's mean log-loss (nats) on the judged releases",
    "gate_constant_log_loss": "The constant's mean log-loss (nats) on the judged releases",
}
GATE_COUNTERS: dict[str, str] = {
    "gate_labels_judged": "Releases the trust gate has judged (continued or not)",
}
# The lpc-return evictor's window (`window_state`), the GPU queue's and, with
# LPCReturnCachePolicy, the CPU tier's: W is a gauge, its re-keyings a counter
WINDOW_GAUGES: dict[str, str] = {
    "return_window_seconds": "W of lpc-return in the GPU queue: 4 x its measured turnover",
    "cpu_return_window_seconds": "W of lpc-return in the CPU tier: 4 x its measured turnover",
}
WINDOW_COUNTERS: dict[str, str] = {
    "return_rekeys": "Re-keyings of lpc-return's queue in the GPU pool",
    "cpu_return_rekeys": "Re-keyings of lpc-return's queue in the CPU tier",
}
# snapshot["histograms"] key -> help text (exported as vllm:lpc_<key>)
HISTOGRAMS: dict[str, str] = {
    "release_seconds": "The plugin's work for one request's release (p, features, table)",
    "free_seconds": "KVCacheManager.free of one request: the plugin, vLLM and the LPC queue",
    "scoring_seconds": "The in-process model's one pass over a step's finished requests",
    "release_probability": "The p releases carry (from the request or the model; not fallbacks)",
    "eviction_age_seconds": "Seconds from a cached block's release to its eviction",
}
MEMORY_HELP = (
    "Bytes LPC's structures hold, by structure (estimated at scrape time from their sizes)"
)
SHADOW_PREFIX = "shadow_"
# Snapshot keys exported under a name and help text of their own; a `shadow_*` key among them
# is not exported a second time by the generic rule.
NAMED_METRICS: tuple[dict[str, str], ...] = (
    COUNTERS,
    REQUEST_LOG_COUNTERS,
    GATE_GAUGES,
    GATE_COUNTERS,
    WINDOW_GAUGES,
    WINDOW_COUNTERS,
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


def model_name_of(vllm_config: Any) -> str:
    """The `model_name` label vLLM gives this engine's metrics (`served_model_name`, which vLLM
    sets to the model when none is served under another name); "" when unknown."""
    model_config = getattr(vllm_config, "model_config", None)
    name = getattr(model_config, "served_model_name", None)
    if isinstance(name, list | tuple):
        name = name[0] if name else None
    if not isinstance(name, str) or not name:
        name = getattr(model_config, "model", None)
    return name if isinstance(name, str) else ""


def gate_state(evictor: Any) -> dict[str, float]:
    """lpc-pooled's trust gate (empty for an evictor without one, e.g. `lpc`, or one whose
    gate is off)."""
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
    and its re-keyings (empty for an evictor without a window)."""
    window_s = getattr(evictor, "window_s", None)
    rekeys = getattr(evictor, "rekeys", None)
    if not isinstance(window_s, float) or not isinstance(rekeys, int):
        return {}
    return {f"{prefix}return_window_seconds": window_s, f"{prefix}return_rekeys": float(rekeys)}


# -- memory held by LPC's structures ---------------------------------------------------------
# Objects whose insides are counted: containers, numpy arrays, and our own packages' classes.
# Anything else (vLLM's blocks a queue points at, threads, locks, clients) is not LPC's
# memory: the reference is counted, not the object.
_OWN_MODULES = ("eviction", "lpc", "predictor", "training")
_CONTAINERS = (list, tuple, set, frozenset, dict, deque)
# Counted by their own size, which includes their data (a numpy array's, an array's).
_SIZED = (str, bytes, bytearray, int, float, bool, type(None), array, np.ndarray)
_SAMPLE = 4  # elements measured per container; the rest are assumed alike
_MAX_DEPTH = 6


def _own(value: object) -> bool:
    module = type(value).__module__
    return module.split(".", 1)[0] in _OWN_MODULES


def _slots(cls: type) -> tuple[str, ...]:
    """Every slot of `cls` and its bases."""
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.extend((slots,) if isinstance(slots, str) else slots)
    return tuple(name for name in names if name not in ("__dict__", "__weakref__"))


def _sampled(container: Any) -> list[Any]:
    """Up to `_SAMPLE` elements (a dict's keys and values), read in one C call each, so a
    structure the scheduler thread changes meanwhile is read consistently or not at all."""
    try:
        if isinstance(container, dict):
            return [x for item in itertools.islice(container.items(), _SAMPLE) for x in item]
        if isinstance(container, list | tuple):
            return list(container[:_SAMPLE])
        if isinstance(container, deque):
            return [container[i] for i in range(min(_SAMPLE, len(container)))]
        return list(itertools.islice(container, _SAMPLE))
    except RuntimeError:  # changed size while read: its elements are left out this time
        return []


def estimate_bytes(root: object, seen: set[int] | None = None) -> int:
    """The bytes `root` holds, estimated in time independent of its size: each object's own
    size (`sys.getsizeof`: a container's table, a numpy array's data), and a container's
    elements as `_SAMPLE` of them measured, scaled to its length. Objects in `seen` (shared
    with a structure counted before) count once."""
    seen = set() if seen is None else seen

    def size(value: object, depth: int, sibling: type | None = None, sampled: bool = False) -> int:
        # `sampled`: an element measured for its container's population, counted even if
        # reached before; `sibling`: its type, whose other instances it points at (a linked
        # node's neighbours, another run) are its container's, counted by the scaling.
        key = id(value)
        if not sampled and (key in seen or depth > _MAX_DEPTH or type(value) is sibling):
            return 0
        seen.add(key)
        if value is None or isinstance(value, bool) or (type(value) is int and -5 <= value <= 256):
            return 0  # the interpreter's own shared objects
        if isinstance(value, _SIZED):
            return sys.getsizeof(value, 0)
        if not isinstance(value, _CONTAINERS) and not _own(value):
            return 0  # vLLM's blocks, threads, locks, clients, functions: not LPC's
        total = sys.getsizeof(value, 0)
        if isinstance(value, _CONTAINERS):
            length = len(value) * (2 if isinstance(value, dict) else 1)
            sample = _sampled(value)
            if sample:
                measured = sum(size(x, depth + 1, type(x), True) for x in sample)
                total += measured * length // len(sample)
            return total
        attributes = getattr(value, "__dict__", None)
        if attributes is not None:  # every attribute (a few), not a sample
            total += sys.getsizeof(attributes, 0)
            total += sum(size(x, depth + 1, sibling) for x in list(attributes.values()))
        for name in _slots(type(value)):
            total += size(getattr(value, name, None), depth + 1, sibling)
        return total

    return size(root, 0)


def memory_bytes(structures: Mapping[str, object]) -> dict[str, float]:
    """`estimate_bytes` of each named structure (None: absent, left out), an object shared
    by two structures counted in the first."""
    seen: set[int] = set()
    return {
        name: float(estimate_bytes(value, seen))
        for name, value in structures.items()
        if value is not None
    }


def plugin_structures(runtime: Any) -> dict[str, object]:
    """The plugin's structures whose memory is exported (`memory_bytes`), by the
    `structure` label: the GPU queue's evictor, the CPU tier's policy, the in-process models
    with their conversation table, the per-request state (hints, deferred and finished
    releases), the prediction board, the shadow caches and the request log's queue."""
    queues = getattr(runtime, "queues", None)
    return {
        "gpu_evictor": getattr(queues, "evictor", None),
        "cpu_tier": getattr(runtime, "cpu_tier_policy", None),
        "in_process_models": getattr(runtime, "access", None),
        "requests": (
            getattr(runtime, "hints", None),
            getattr(runtime, "deferred_releases", None),
            getattr(runtime, "finished", None),
        ),
        "predictions": getattr(runtime, "board", None),
        "shadow": getattr(runtime, "shadow", None),
        "request_log": getattr(runtime, "request_log", None),
    }


# -- the families -------------------------------------------------------------------------------
def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def metric_families(data: Mapping[str, Any]) -> list[Any]:
    """The plugin's metric families from its snapshot (`vllm_plugin.stats_snapshot`), every
    sample labelled with `model_name` and `engine` (the snapshot's `model_name` and
    `dp_rank`). Empty when the plugin is not registered."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    if not data.get("registered"):
        return []
    base = [str(data.get("model_name", "")), str(data.get("dp_rank", 0))]
    labels = [MODEL_LABEL, ENGINE_LABEL]
    out: list[Any] = []

    def counter(name: str, help_text: str, value: float) -> None:
        family = CounterMetricFamily(f"{PREFIX}{name}", help_text, labels=labels)
        family.add_metric(base, value)
        out.append(family)

    def gauge(name: str, help_text: str, value: float) -> None:
        family = GaugeMetricFamily(f"{PREFIX}{name}", help_text, labels=labels)
        family.add_metric(base, value)
        out.append(family)

    for name, help_text in COUNTERS.items():
        counter(name, help_text, data.get(name, 0))
    for table, add in (
        (REQUEST_LOG_COUNTERS, counter),
        (SHADOW_COUNTERS, counter),
        (SHADOW_GAUGES, gauge),
        (GATE_GAUGES, gauge),
        (GATE_COUNTERS, counter),
        (WINDOW_GAUGES, gauge),
        (WINDOW_COUNTERS, counter),
    ):
        for name, help_text in table.items():
            if name in data:
                add(name, help_text, data[name])
    if "mode" in data:
        mode = GaugeMetricFamily(
            f"{PREFIX}mode", "1 for the mode the plugin runs in", labels=[*labels, "mode"]
        )
        for name in MODES:
            mode.add_metric([*base, name], 1.0 if data["mode"] == name else 0.0)
        out.append(mode)
        counter("mode_switches", "Mode switches while running", data["mode_switches"])
    gauge(
        "pending_predictions",
        "Predictions asked for and not yet consumed",
        data.get("pending_predictions", 0),
    )
    if "conversations" in data:  # an access-only model runs in process
        gauge("conversations", "Conversations in the access model's table", data["conversations"])
    memory: Mapping[str, float] = data.get("memory_bytes", {})
    if memory:
        family = GaugeMetricFamily(
            f"{PREFIX}memory_bytes", MEMORY_HELP, labels=[*labels, "structure"]
        )
        for name, value in memory.items():
            family.add_metric([*base, name], value)
        out.append(family)
    named = {name for table in NAMED_METRICS for name in table}
    for name, value in data.items():
        if name.startswith(SHADOW_PREFIX) and _is_number(value) and name not in named:
            gauge(name, f"{name} (the stats snapshot's shadow figure)", value)
    histograms: Mapping[str, Any] = data.get("histograms", {})
    for name, help_text in HISTOGRAMS.items():
        if name not in histograms:
            continue
        snapshot = HistogramSnapshot.of(histograms[name])
        family = HistogramMetricFamily(f"{PREFIX}{name}", help_text, labels=labels)
        buckets = [(_bucket_label(b), c) for b, c in snapshot.cumulative()]
        family.add_metric(base, buckets, snapshot.total)
        out.append(family)
    return out


def _bucket_label(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class _Collector:
    """A prometheus_client collector over `metric_families` (the fallback port's registry)."""

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Any]:
        yield from metric_families(self._read())


# -- vLLM's /metrics: prometheus_client's multiprocess files ------------------------------------
class MultiprocessWriter:
    """Writes metric families as prometheus_client multiprocess values in
    `PROMETHEUS_MULTIPROC_DIR`, which vLLM's `/metrics` merges (`MultiProcessCollector`).

    Each sample's value is set, not incremented: a counter's file holds this process's total,
    which the collector sums with other processes' (each engine core has its own `engine`
    label, so nothing is summed across engines). Gauges are `mostrecent`, as vLLM's own.
    Histogram buckets are written per bucket, as prometheus_client's own histograms write
    them (the collector accumulates them). The files are named after this process
    (`lpc-<pid>`), apart from any prometheus_client metric the process has of its own."""

    def __init__(self) -> None:
        from prometheus_client import values

        self._value_class = values.MultiProcessValue(lambda: f"lpc-{os.getpid()}")
        self._values: dict[tuple[Any, ...], Any] = {}

    def _value(
        self, typ: str, family: Any, sample_name: str, labels: Mapping[str, str], mode: str
    ) -> Any:
        names = tuple(labels)
        values = tuple(labels[name] for name in names)
        key = (typ, family.name, sample_name, names, values)
        value = self._values.get(key)
        if value is None:
            value = self._value_class(
                typ, family.name, sample_name, names, values, family.documentation,
                multiprocess_mode=mode,
            )  # fmt: skip
            self._values[key] = value
        return value

    def write(self, families: Iterable[Any]) -> None:
        now = time.time()
        for family in families:
            typ = family.type
            if typ == "counter":
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        self._value(typ, family, sample.name, sample.labels, "").set(sample.value)
            elif typ == "gauge":
                for sample in family.samples:
                    self._value(typ, family, sample.name, sample.labels, "mostrecent").set(
                        sample.value, now
                    )
            elif typ == "histogram":
                self._write_histogram(family)

    def _write_histogram(self, family: Any) -> None:
        previous: dict[tuple[tuple[str, str], ...], float] = {}
        for sample in family.samples:  # buckets in ascending order, cumulative
            if sample.name.endswith("_bucket"):
                rest = tuple((k, v) for k, v in sample.labels.items() if k != "le")
                count = sample.value - previous.get(rest, 0.0)
                previous[rest] = sample.value
                self._value("histogram", family, sample.name, sample.labels, "").set(count)
            elif sample.name.endswith("_sum"):
                self._value("histogram", family, sample.name, sample.labels, "").set(sample.value)


class MetricsExport(Protocol):
    def close(self) -> None: ...


@dataclass
class MetricsFlusher:
    """Writes the families of `read()` every `interval_s` on a background thread, and once
    more at `close()`, so vLLM's `/metrics` shows them within `interval_s`. A failed flush is
    logged once and tried again at the next."""

    read: Callable[[], dict[str, Any]]
    writer: MultiprocessWriter
    interval_s: float = FLUSH_INTERVAL_S
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _failed: bool = field(default=False, repr=False)

    def start(self) -> MetricsFlusher:
        self.flush()
        self._thread = threading.Thread(target=self._run, name="lpc-metrics", daemon=True)
        self._thread.start()
        return self

    def flush(self) -> bool:
        try:
            self.writer.write(metric_families(self.read()))
        except Exception as error:
            if not self._failed:
                self._failed = True
                logger.warning(
                    "LPC metrics could not be written for vLLM's /metrics (%r); tried again "
                    "every %g s (logged once)",
                    error,
                    self.interval_s,
                )
            return False
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.flush()


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
    """Serve the families on host:port (the fallback); None (with a warning) when the port
    is taken."""
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


def start_export(
    read: Callable[[], dict[str, Any]],
    host: str,
    port: int | None,
    rank: int,
    environ: Mapping[str, str] = os.environ,
    interval_s: float = FLUSH_INTERVAL_S,
) -> MetricsExport | None:
    """Export the plugin's metrics by the route this engine has (the module says which):
    vLLM's `/metrics` through `PROMETHEUS_MULTIPROC_DIR`, else the plugin's own port when one
    is configured, else nothing, said in one line."""
    directory = environ.get(MULTIPROC_VARIABLE)
    if directory:
        if not os.path.isdir(directory):
            logger.warning(
                "LPC metrics not exported: %s=%s is not a directory", MULTIPROC_VARIABLE, directory
            )
            return None
        if port is not None:
            logger.info(
                "LPC metrics go to vLLM's /metrics (%s is set); metrics_port %d is not opened",
                MULTIPROC_VARIABLE,
                port,
            )
        flusher = MetricsFlusher(read, MultiprocessWriter(), interval_s).start()
        logger.info("LPC metrics exported through vLLM's /metrics (%s)", MULTIPROC_VARIABLE)
        return flusher
    if port is not None:
        return start_metrics_server(read, host, metrics_port_for(port, rank))
    logger.info(
        "LPC metrics are not exported: vLLM's /metrics shows them when %s is set (vLLM sets "
        "it with --api-server-count > 1), or set metrics_port to serve them on a port of "
        "their own",
        MULTIPROC_VARIABLE,
    )
    return None
