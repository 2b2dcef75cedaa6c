"""Counters of what the serving plugin did: where probabilities came from, what it evicted.

The engine's scheduler thread and the prediction worker thread both count, so increments go
through one lock (uncontended on the hot path: the worker counts once per batch).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass
class PluginStats:
    """Running totals since the plugin was registered.

    Releases (a request giving its blocks back) by where their probability came from:
    `probabilities_from_request` (the request carried one), `predictions_used` (an asynchronous
    prediction had arrived), `fallbacks_used` (neither: the configured fallback p). A release
    falls back when no prediction was asked for, when it was late (`predictions_late`), when
    its predictor call failed (`predictor_failures` counts failed calls of `predictor_calls`,
    errors and timeouts alike; the client's own breakdown is
    `stats_snapshot()["predictor_client"]`),
    or when too many were pending (`predictions_dropped`). `invalid_hints` counts requests
    whose LPC fields were malformed and ignored. Block counters: `evictions` (a cached block
    handed out again), `cached_blocks_released`, `uncached_blocks_released` and
    `shared_blocks_released` (released by one request while others still hold them).
    With an access-only model in process: `predictions_in_process` (releases whose p it
    computed; they count as `predictions_used` too), `access_model_reloads` (a promoted model
    swapped in), `access_model_reload_failures` (one that could not be loaded: the old one
    stays) and `access_prediction_errors` (a request it could not read: the fallback p).
    """

    releases: int = 0
    probabilities_from_request: int = 0
    predictions_used: int = 0
    fallbacks_used: int = 0
    predictions_requested: int = 0
    predictions_answered: int = 0
    predictions_late: int = 0
    predictions_dropped: int = 0
    predictor_failures: int = 0
    predictor_calls: int = 0
    invalid_hints: int = 0
    evictions: int = 0
    cached_blocks_released: int = 0
    uncached_blocks_released: int = 0
    shared_blocks_released: int = 0
    predictions_in_process: int = 0
    access_model_reloads: int = 0
    access_model_reload_failures: int = 0
    access_prediction_errors: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        """Add to several counters at once, atomically."""
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {name: getattr(self, name) for name in _COUNTER_NAMES}

    def summary(self) -> str:
        """One log line with the counters an operator watches."""
        s = self.snapshot()
        return (
            f"LPC: {s['releases']} releases (p from request {s['probabilities_from_request']}, "
            f"predicted {s['predictions_used']}, fallback {s['fallbacks_used']}); predictions "
            f"requested {s['predictions_requested']}, late {s['predictions_late']}, dropped "
            f"{s['predictions_dropped']}, predictor failures {s['predictor_failures']}; "
            f"in process {s['predictions_in_process']} (model reloads "
            f"{s['access_model_reloads']}, failed {s['access_model_reload_failures']}); "
            f"evictions {s['evictions']}"
        )


_COUNTER_NAMES = tuple(f.name for f in fields(PluginStats) if not f.name.startswith("_"))
