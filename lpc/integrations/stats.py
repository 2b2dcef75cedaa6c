"""Counters of what the serving plugin did: where probabilities came from, what it evicted.

The engine's scheduler thread and the prediction worker thread both count, so increments go
through one lock (uncontended on the hot path: the worker counts once per batch).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, fields
from numbers import Real

logger = logging.getLogger("vllm.plugins.lpc")


@dataclass
class PluginStats:
    """Running totals since the plugin was registered.

    Releases (a request giving its blocks back) by where their probability came from:
    `probabilities_from_request` (the request carried one), `predictions_used` (an asynchronous
    prediction had arrived), `fallbacks_used` (neither: the configured fallback p). A release
    falls back when no prediction was asked for, when it was late (`predictions_late`; when
    it comes later, `late_predictions_used` counts the releases it re-keyed in a free queue and
    `late_runs_rekeyed` their runs: `late_predictions`), when
    its predictor call failed (`predictor_failures` counts failed calls of `predictor_calls`,
    errors and timeouts alike; the client's own breakdown is
    `stats_snapshot()["predictor_client"]`),
    or when too many were pending (`predictions_dropped`). `invalid_hints` counts requests
    whose LPC fields were malformed and ignored; `untrusted_probabilities` requests whose body
    carried a probability the trust boundary ignored (`trust`: not signed, clients not
    trusted), in either tier (the CPU tier's from `kv_transfer_params`: `vllm_cache_policy`).
    `pinned_share_capped` counts releases keyed at the fallback p because their blocks would
    have taken their tenant's pinned blocks past `pinned_share` of the pool (`vllm_queue`), in
    either tier (the CPU tier's chunks: `cpu_tier_policy`).
    Block counters: `evictions` (a cached block handed out again by the learned evictor in
    `lpc` mode; off, its drain counts none), `cached_blocks_released`,
    `uncached_blocks_released` and `shared_blocks_released` (released by one request while
    others still hold them).
    With an access-only model in process: `predictions_in_process` (releases whose p it
    computed; they count as `predictions_used` too), `in_process_scoring_calls` (its forward
    passes: one per scheduler step through the scheduler class, however many requests the
    step finished; one per release elsewhere), `access_model_reloads` (a promoted model
    swapped in), `access_model_reload_failures` (one that could not be loaded: the old one
    stays) and `access_prediction_errors` (a request it could not read: the fallback p).
    With a return-time model in process: `return_curves_in_process` (finished releases whose
    curve it computed), `return_curve_errors` (it raised, or could not read the request) and
    `invalid_return_curves` (its curve was not a survival curve): both of those give the
    release no curve, the evictor's fallback score; `return_model_reloads` and
    `return_model_reload_failures` as for the access model.

    Fail-safe: `invalid_probabilities` counts probabilities that were not a finite number in
    [0, 1] (a request's `lpc_probability`, the values of a predictor answer, the in-process
    model's output): each was replaced by the fallback p. `plugin_errors` counts exceptions the
    plugin caught in its own code inside a vLLM call (the release path, the free queue, the
    request log, scheduling): that call went on as stock vLLM would (fallback p, LRU-equivalent
    order); each place logs its first exception only.

    Preemption: `preemptions` counts requests that released their blocks unfinished (vLLM
    preempted them, or freed them to retry); their cached blocks, `protected_blocks_released`,
    are queued after every free block, as LRU queues them last, and the release is neither
    predicted nor counted in `releases`.
    """

    releases: int = 0
    probabilities_from_request: int = 0
    predictions_used: int = 0
    fallbacks_used: int = 0
    predictions_requested: int = 0
    predictions_answered: int = 0
    predictions_late: int = 0
    late_predictions_used: int = 0
    late_runs_rekeyed: int = 0
    predictions_dropped: int = 0
    predictor_failures: int = 0
    predictor_calls: int = 0
    invalid_hints: int = 0
    untrusted_probabilities: int = 0
    pinned_share_capped: int = 0
    evictions: int = 0
    cached_blocks_released: int = 0
    uncached_blocks_released: int = 0
    shared_blocks_released: int = 0
    predictions_in_process: int = 0
    in_process_scoring_calls: int = 0
    access_model_reloads: int = 0
    access_model_reload_failures: int = 0
    access_prediction_errors: int = 0
    return_curves_in_process: int = 0
    return_curve_errors: int = 0
    invalid_return_curves: int = 0
    return_model_reloads: int = 0
    return_model_reload_failures: int = 0
    invalid_probabilities: int = 0
    plugin_errors: int = 0
    preemptions: int = 0
    protected_blocks_released: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _logged: set[str] = field(default_factory=set, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        """Add to several counters at once, atomically."""
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def first_time(self, what: str) -> bool:
        """True the first time `what` is asked about (to log a recurring problem once)."""
        with self._lock:
            if what in self._logged:
                return False
            self._logged.add(what)
            return True

    def fault(self, counter: str, message: str, *args: object) -> None:
        """Count a recurring fault in `counter` and log the first one (`message % args`, a
        warning that says it is logged once and where the rest are counted)."""
        self.add(**{counter: 1})
        if self.first_time(f"fault: {counter}"):
            logger.warning(f"{message} (logged once; counted in {counter})", *args)

    def plugin_error(self, where: str, error: BaseException) -> None:
        """Count an exception the plugin caught in `where`; log the first one of each place
        with its traceback (the caller falls back to stock vLLM's behaviour for the call)."""
        self.add(plugin_errors=1)
        if self.first_time(f"error: {where}"):
            logger.error(
                "LPC plugin: %s failed (%r); this call falls back to vLLM's own behaviour and "
                "vLLM keeps serving (further failures here are counted in plugin_errors, not "
                "logged)",
                where,
                error,
                exc_info=error,
            )

    def invalid_probability(self, source: str, value: object) -> None:
        """Count a probability from `source` that is not a finite number in [0, 1] (the
        caller uses the fallback p instead); log the first one from each source."""
        self.add(invalid_probabilities=1)
        if self.first_time(f"invalid p: {source}"):
            logger.warning(
                "LPC plugin: %s gave the probability %.80r, not a finite number in [0, 1]; "
                "the fallback p is used (counted in invalid_probabilities, logged once)",
                source,
                value,
            )

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {name: getattr(self, name) for name in _COUNTER_NAMES}

    def summary(self) -> str:
        """One log line with the counters an operator watches (the return-time model's once it
        has computed or failed a curve)."""
        s = self.snapshot()
        failed_curves = s["return_curve_errors"] + s["invalid_return_curves"]
        returns = ""
        if s["return_curves_in_process"] or failed_curves:
            returns = (
                f"; return curves {s['return_curves_in_process']} (failed {failed_curves}, "
                f"model reloads {s['return_model_reloads']}, failed "
                f"{s['return_model_reload_failures']})"
            )
        return (
            f"LPC: {s['releases']} releases (p from request {s['probabilities_from_request']}, "
            f"predicted {s['predictions_used']}, fallback {s['fallbacks_used']}); predictions "
            f"requested {s['predictions_requested']}, late {s['predictions_late']}, dropped "
            f"{s['predictions_dropped']}, predictor failures {s['predictor_failures']}; "
            f"in process {s['predictions_in_process']} (model reloads "
            f"{s['access_model_reloads']}, failed {s['access_model_reload_failures']}); "
            f"invalid p {s['invalid_probabilities']}, plugin errors {s['plugin_errors']}; "
            f"evictions {s['evictions']}{returns}"
        )


_COUNTER_NAMES = tuple(f.name for f in fields(PluginStats) if not f.name.startswith("_"))


def is_probability(value: object) -> bool:
    """Whether `value` is a real number (not a bool; numpy's count) in [0, 1], so finite."""
    if type(value) is float:  # the common case, without the ABC check (every release)
        return 0.0 <= value <= 1.0
    return isinstance(value, Real) and not isinstance(value, bool) and 0.0 <= value <= 1.0
