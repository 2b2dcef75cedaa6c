"""The vLLM plugin: LPC eviction in vLLM 0.33.0's prefix cache.

vLLM loads it through the `vllm.general_plugins` entry point (`lpc`) in every process before
the engine core builds its scheduler. Loaded, it patches nothing (`register`). LPC runs where
an engine names the LPC scheduler class (`--scheduler-cls`, `vllm_scheduler_class`), which
registers its runtime here (`install_runtime`), or, on a vLLM with the eviction-policy seam,
where a block pool names the policy `lpc` (`vllm_seam`). A release is made once per request,
in `PluginRuntime.release_for`.

Where a release's p comes from, the call flow, preemption, the fail-safe and the one
registration: docs/design.md, "The vLLM plugin (`lpc/integrations/vllm_plugin.py`)".
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from eviction.base import Release
from eviction.lpc import DEFAULT_FALLBACK_PROBABILITY
from lpc.integrations import engine_checks, vllm_compat, vllm_seam
from lpc.integrations.access_runtime import (
    AccessRuntime,
    ReleaseItem,
    ReleaseOutcome,
    load_access_runtime,
)
from lpc.integrations.config import PluginConfig, PluginConfigError, load_config
from lpc.integrations.engine_config import configured_by_environment
from lpc.integrations.finished_releases import FinishedReleases
from lpc.integrations.kill_switch import ControlFileWatcher, ModeSwitch
from lpc.integrations.metrics import (
    MetricsExport,
    gate_state,
    memory_bytes,
    model_name_of,
    plugin_structures,
    start_export,
    window_state,
)
from lpc.integrations.plugin_request_log import PluginRequestLog
from lpc.integrations.predictions import PredictionBoard, PredictionClient
from lpc.integrations.request_hints import PROBABILITY_KEY, RequestHints, parse_hints
from lpc.integrations.return_runtime import load_return_runtime
from lpc.integrations.shadow import ShadowFeed
from lpc.integrations.stats import PluginStats, is_probability
from lpc.integrations.trust import HintTrust
from lpc.integrations.vllm_queue import (
    Clock,
    LPCFreeBlockQueue,
    ProtectedRelease,
    QueueRuntime,
    TenantRelease,
)

if TYPE_CHECKING:
    from predictor.return_curve import ReturnCurve

# A child of vLLM's logger, so the plugin's lines appear in vLLM's log with its format.
logger = logging.getLogger("vllm.plugins.lpc")

MAX_LOGGED_INVALID_HINTS = 20
_PROBABILITY_SOURCES = {
    "probabilities_from_request": "client",
    "predictions_used": "model",
    "fallbacks_used": "fallback",
}


@dataclass
class PluginRuntime:
    """Everything LPC's calls in the engine need (a release, a first scheduling, the step's
    scoring); one per registration."""

    config: PluginConfig
    stats: PluginStats
    queues: QueueRuntime
    client: PredictionClient | None
    board: PredictionBoard | None
    hints: dict[str, RequestHints] = field(default_factory=dict)  # requests seen scheduled
    # id(block) -> the release of the request whose deferred free (pop_blocks_for_free) popped it
    deferred_releases: dict[int, Release] = field(default_factory=dict)
    next_log_s: float = 0.0
    request_log: PluginRequestLog | None = None  # None: no request log configured
    # The in-process models (access-only model, return-time model) and their conversation
    # table; None: neither runs in process.
    access: AccessRuntime | None = None
    shadow: ShadowFeed | None = None  # feeds the shadow caches while the mode is `shadow`
    # Stamps completions for the access features, on the timeline of vLLM's arrival times.
    wall_clock: Clock = time.time
    # Each finished request's release, for the CPU offload tier's policy (`vllm_cache_policy`).
    finished: FinishedReleases = field(default_factory=FinishedReleases)
    # The `kv_connector_extra_config` of the engine whose scheduler is being built (the CPU
    # tier's policy is built inside `Scheduler.__init__` and reads its `lpc_*` keys here).
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    # The CPU tier's policy of this engine, once vLLM has built one (its evictor's W is
    # exported beside the GPU queue's).
    cpu_tier_policy: Any = None
    # Which hints a release may use (`trust`); from the configuration.
    trust: HintTrust = field(init=False)
    # The engine's `model_name` metrics label (vLLM's `served_model_name`; `metrics`).
    model_name: str = ""
    # What `score_finished` computed for the requests a step finished, until their releases
    # take it (by request id): the in-process models' outcome, and hints not kept elsewhere.
    scored: dict[str, ReleaseOutcome] = field(default_factory=dict)
    scored_hints: dict[str, RequestHints] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.trust = HintTrust(self.config.trust_request_hints, self.config.hint_key)

    @property
    def clock(self) -> Clock:
        return self.queues.clock

    def hints_for(self, request: Any) -> RequestHints:
        """The request's hints as a release may use them: parsed, then through the trust
        boundary (`trust`: an unsigned body probability dropped, the conversation namespaced
        by tenant, vLLM's `session_id` and `kv_hints` read)."""
        params = request.sampling_params
        extra_args = params.extra_args if params is not None else None
        hints, untrusted = self.trust.apply(request, parse_hints(extra_args))
        if untrusted:
            self.stats.add(untrusted_probabilities=1)
        if hints.problems:
            self.stats.add(invalid_hints=1)
            if hints.probability is None and isinstance(extra_args, Mapping):
                carried = extra_args.get(PROBABILITY_KEY)
                if carried is not None and not is_probability(carried):  # given, and bad
                    self.stats.invalid_probability("a request's lpc_probability", carried)
            if self.stats.invalid_hints <= MAX_LOGGED_INVALID_HINTS:
                logger.warning(
                    "request %s: ignoring malformed LPC fields: %s",
                    request.request_id,
                    "; ".join(hints.problems),
                )
        return hints

    def on_scheduled(self, request: Any) -> None:
        """Ask for the request's prediction the first time it is scheduled (never waits)."""
        rid = request.request_id
        hints = self.hints.get(rid)
        if hints is None:
            hints = self.hints[rid] = self.hints_for(request)
        board = self.board
        if (
            board is not None
            and hints.probability is None
            and hints.can_predict
            and not board.has(rid)
        ):
            board.ask(rid, hints.prediction_item(engine_prompt_tokens(request)))

    def conversation_of(self, request: Any) -> str | None:
        """The request's `lpc_conversation_id` (the shadow's admissions): its hints if kept,
        else parsed here and not kept (the release parses them again, and counts problems)."""
        hints = self.hints.get(request.request_id)
        if hints is None:
            params = request.sampling_params
            extra_args = params.extra_args if params is not None else None
            hints = self.trust.apply(request, parse_hints(extra_args))[0]
        return hints.conversation_id

    def release_for(self, request: Any) -> Release:
        """The probability, time and conversation of a request releasing its blocks; for a
        request that is not finished (preempted), a `ProtectedRelease`."""
        if is_unfinished(request):
            return self.preemption_release(request)
        release = self.release_and_source(request)[0]
        self.finished.record(request.request_id, release)
        return release

    def preemption_release(self, request: Any) -> ProtectedRelease:
        """A preempted request's release: its blocks go after every free block until it is
        rescheduled (it will need them in milliseconds). Nothing is predicted, logged or
        recorded in the conversation table, and its hints and prediction stay for the release
        that finishes it."""
        rid = request.request_id
        hints = self.hints.get(rid)
        if hints is None:
            hints = self.hints[rid] = self.hints_for(request)
        self.stats.add(preemptions=1)
        return ProtectedRelease(self.clock(), None, hints.conversation_id or rid)

    def safe_release_for(self, request: Any) -> Release:
        """`release_for` for vLLM's hooks: it never raises. On an error in the plugin's own
        code the release gets the fallback p at the current time (stock vLLM's LRU place),
        the error is counted in `plugin_errors` and its first occurrence logged. Its time is
        the release latency histogram's observation."""
        start_ns = perf_counter_ns()
        try:
            release = self.release_for(request)
        except Exception as error:
            self.stats.plugin_error("a request's release", error)
            rid = getattr(request, "request_id", None)
            if isinstance(rid, str):
                self.hints.pop(rid, None)
                if self.board is not None:
                    self.board.forget(rid)
            else:
                rid = None
            release = Release(self.clock(), None, rid)
        self.queues.histograms.release_latency_ns.observe(perf_counter_ns() - start_ns)
        if self.shadow is not None:
            self.shadow.finished(request, release)  # never raises
        return release

    def safe_on_scheduled(self, request: Any) -> None:
        """`on_scheduled` for vLLM's hook: an error only costs the request its prediction."""
        try:
            self.on_scheduled(request)
        except Exception as error:
            self.stats.plugin_error("asking for a prediction", error)

    def release_and_source(self, request: Any) -> tuple[Release, str]:
        """`release_for`, and where its probability came from (client, model, fallback);
        a finished request is appended to the request log here.

        Every probability is checked here, whatever its source: one that is not a finite
        number in [0, 1] is replaced by the fallback p and counted (`invalid_probabilities`).
        An error while getting it (the model, the conversation table, the predictor board)
        costs the release its prediction, not the request (`plugin_errors`)."""
        rid = request.request_id
        hints = self.hints.pop(rid, None)
        scheduled = hints is not None  # seen by the scheduling hook, which asked if it could
        if hints is None:
            hints = self.scored_hints.pop(rid, None) or self.hints_for(request)
        coming = False  # the prediction is on its way: the queues re-key when it comes
        try:
            probability, counter, curve, coming = self._probability(request, hints, not scheduled)
        except Exception as error:
            self.stats.plugin_error("the release's probability", error)
            if self.board is not None:
                self.board.forget(rid)
            probability, counter, curve = None, "fallbacks_used", None
        if probability is not None and not is_probability(probability):
            self.stats.invalid_probability(f"the {_PROBABILITY_SOURCES[counter]}", probability)
            probability, counter = None, "fallbacks_used"
        if probability is not None:
            probability = float(probability)
            self.queues.histograms.probability.observe(probability)
        self.stats.add(releases=1, **{counter: 1})
        now = self.clock()
        if self.config.stats_log_interval_s and now >= self.next_log_s:
            self.next_log_s = self._log_stats(now)
        source = _PROBABILITY_SOURCES[counter]
        if self.request_log is not None:
            used = probability if probability is not None else self.config.fallback_probability
            try:
                self.request_log.finished(request, hints, used, source)
            except Exception as error:
                self.stats.plugin_error("the request log", error)
        # The tenant, and whether the p is its trusted hint: the queue's pinned cap.
        release = TenantRelease(
            now,
            probability,
            hints.conversation_id or rid,
            return_curve=curve,
            tenant=hints.tenant,
            hinted=source == "client",
            awaiting=rid if coming else None,
        )
        return release, source

    def _probability(
        self, request: Any, hints: RequestHints, ask: bool = False
    ) -> tuple[float | None, str, ReturnCurve | None, bool]:
        """The release's p (unchecked), the counter of its source, its return curve from the
        in-process return-time model (checked; None without one, or the fallback score), and
        whether the predictor's answer is still on its way (then the p is None). One
        in-process release computes the p and the curve from the same features. `ask`: the
        request was never seen scheduled (the seam path has no scheduling hook), so its
        prediction is asked for now."""
        rid = request.request_id
        probability = hints.probability
        access = self.access
        if probability is not None:
            if self.board is not None:
                self.board.forget(rid)
            curve = None
            scored = self.scored.pop(rid, None)
            if scored is not None:  # recorded by `score_finished`
                curve = scored.curve
            elif access is not None:
                try:
                    curve = access.record_release(
                        request,
                        hints.conversation_id,
                        self.wall_clock(),
                        engine_prompt_tokens(request) or 0,
                    )
                except Exception as error:  # the request's own p stands
                    self.stats.plugin_error("recording a request in the conversation table", error)
            return probability, "probabilities_from_request", curve, False
        curve = None
        if access is not None:
            probability, curve = self.in_process_release(request, hints)
        board = self.board
        if (access is None or access.model is None) and board is not None:
            if ask and hints.can_predict and not board.has(rid):
                # Asked now; the release is re-keyed when the answer comes.
                board.ask(rid, hints.prediction_item(engine_prompt_tokens(request)))
            probability, coming = board.claim(rid)
            if coming:
                return None, "fallbacks_used", curve, True
        counter = "fallbacks_used" if probability is None else "predictions_used"
        return probability, counter, curve, False

    def _log_stats(self, now: float) -> float:
        """The counters' log line (not the first time: nothing happened yet); when the next
        is due. A failure is counted, and the line skipped."""
        if self.next_log_s:
            try:
                logger.info("%s", self.stats.summary())
                if self.request_log is not None:
                    logger.info("%s", self.request_log.summary())
            except Exception as error:
                self.stats.plugin_error("the stats log line", error)
        return now + self.config.stats_log_interval_s

    def in_process_release(
        self, request: Any, hints: RequestHints
    ) -> tuple[float | None, ReturnCurve | None]:
        """The in-process models' p and return curve for this release, computed here
        (microseconds). The p is None (the fallback p) without an access model, or if the
        request cannot be read, the model fails, or its p is not a finite number in [0, 1];
        the curve is None (the fallback score) without a return model, or if the request
        cannot be read or the curve is not valid (`ReturnModelRuntime.curve` counts it): a
        request is never failed."""
        access = self.access
        assert access is not None
        if self.board is not None and access.model is not None:
            self.board.forget(request.request_id)
        outcome = self.scored.pop(request.request_id, None)  # this step's batch computed it
        try:
            if outcome is None:
                outcome = access.release(
                    request,
                    hints.conversation_id,
                    self.wall_clock(),
                    engine_prompt_tokens(request) or 0,
                )
        except Exception as error:  # the request cannot be read: neither model can run
            if access.model is not None:
                self._access_prediction_error(request, error)
            if access.returns is not None:
                self.stats.fault(
                    "return_curve_errors",
                    "request %s: the return-time model cannot read it (%r); fallback score",
                    request.request_id,
                    error,
                )
            return None, None
        if access.model is None:
            return None, outcome.curve
        if outcome.error is not None:
            self._access_prediction_error(request, outcome.error)
            return None, outcome.curve
        probability = outcome.probability
        if not is_probability(probability):
            self.stats.invalid_probability("the access model", probability)
            return None, outcome.curve
        self.stats.add(predictions_in_process=1)
        return float(probability), outcome.curve  # type: ignore[arg-type]

    def score_finished(self, requests: Sequence[Any]) -> None:
        """The in-process models' outcomes for the finished requests a scheduler step is about
        to release, in their order: the access model's p of all in one forward pass
        (`AccessRuntime.release_many`), so that the step runs the model once, not once per
        request. Each release then takes its own (`_probability`); the caller clears what is
        left (`scored`) once they are done. Never raises: on an error the releases compute
        theirs one by one, as without it. Its time goes to `lpc_scoring_seconds`: it is spent
        before the frees, so neither `lpc_free_seconds` nor `lpc_release_seconds` holds it."""
        access = self.access
        if access is None or not requests:
            return
        start_ns = perf_counter_ns()
        try:
            now = self.wall_clock()
            items, ids = [], []
            for request in requests:
                rid = request.request_id
                hints = self.hints.get(rid)
                if hints is None:
                    hints = self.scored_hints.get(rid)
                    if hints is None:
                        hints = self.scored_hints[rid] = self.hints_for(request)
                prompt_tokens = engine_prompt_tokens(request) or 0
                predict = hints.probability is None
                items.append(
                    ReleaseItem(request, hints.conversation_id, now, prompt_tokens, predict)
                )
                ids.append(rid)
            outcomes = access.release_many(items)
        except Exception as error:
            self.stats.plugin_error("scoring a step's finished requests", error)
            ids, outcomes = [], []
        for rid, outcome in zip(ids, outcomes, strict=True):
            if outcome is not None:  # else its release reads it again, and counts the error
                self.scored[rid] = outcome
        self.queues.histograms.scoring_latency_ns.observe(perf_counter_ns() - start_ns)

    def _access_prediction_error(self, request: Any, error: BaseException) -> None:
        self.stats.fault(
            "access_prediction_errors",
            "request %s: the access model cannot predict it (%r); fallback p",
            request.request_id,
            error,
        )

    def hold_for_deferred_free(self, blocks: list[Any], release: Release) -> None:
        """Blocks popped for a deferred free: remember their release until they are freed."""
        for block in blocks:
            self.deferred_releases[id(block)] = release

    def take_deferred_release(self, blocks: list[Any]) -> Release | None:
        """The release held for these blocks (forgotten once taken), or None."""
        if not self.deferred_releases:
            return None
        found = None
        for block in blocks:
            release = self.deferred_releases.pop(id(block), None)
            if found is None:
                found = release
        return found


@dataclass
class _Registration:
    runtime: PluginRuntime
    metrics: MetricsExport | None = None
    control: ControlFileWatcher | None = None


_REGISTRATION: _Registration | None = None
# Why this process runs stock vLLM (vLLM's modules not importable, or a seam of another
# shape), once said; None: not decided so.
_STOCK_REASON: str | None = None
# Whether `register()` said that `LPC_*` settings alone change nothing (once per process).
_SAID_ENVIRONMENT = False
# With vLLM's eviction-policy seam: the modules, for a runtime installed when vLLM builds the
# first LPC queue (`seam_runtime`).
_SEAM: dict[str, Any] = {}
_LOCK = threading.Lock()


def engine_prompt_tokens(request: Any) -> int | None:
    """The request's prompt size in the engine's tokens (vLLM's `Request.num_prompt_tokens`:
    the conversation so far plus the new message, through the chat template), or None when
    absent or not a count; registration checks vLLM sets it, and a request is never failed."""
    count = getattr(request, "num_prompt_tokens", None)
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    return None


def is_unfinished(request: Any) -> bool:
    """True when vLLM frees a request's blocks before it finishes: `Scheduler._preempt_request`
    frees them while the request is still RUNNING, and a failed KV load frees them to retry
    locally. A request without vLLM's `is_finished()` counts as finished."""
    is_finished = getattr(request, "is_finished", None)
    return callable(is_finished) and not is_finished()


def free_with_release(
    runtime: PluginRuntime, pool: Any, blocks: list[Any], free: Callable[[Any, list[Any]], None]
) -> None:
    """`free(pool, blocks)` (vLLM's `BlockPool.free_blocks`) under the release being freed,
    else the one held for these blocks by a deferred free, else the fallback p now; then the
    release's blocks other requests still hold are noted (max pooling). The wrapped
    `free_blocks`, and the scheduler class's drain of deferred frees, free through here."""
    queues = runtime.queues
    try:
        release = queues.active_release() or runtime.take_deferred_release(blocks)
        shared = shared_blocks(blocks, pool)
    except Exception as error:  # stock vLLM: the fallback p, no pooling metadata
        runtime.stats.plugin_error("preparing a free of blocks", error)
        release, shared = None, []
    if release is None:
        release = Release(queues.clock(), None, None)
    with queues.releasing(release):
        free(pool, blocks)
    queue = pool.free_block_queue  # vLLM's own again if the LPC queue tripped in this free
    if shared and isinstance(queue, LPCFreeBlockQueue):
        queue.note_shared_release(shared, release)


def shared_blocks(ordered_blocks: Sequence[Any], pool: Any) -> list[Any]:
    """Cached blocks of `pool` among those a release frees whose count stays above zero: the
    release shares them with other requests (max pooling notes them). The wrapped
    `free_blocks` and the seam's `on_request_freed` (`vllm_seam`) both read them here."""
    return [
        block
        for block in ordered_blocks
        if block.ref_cnt > 1
        and block.block_hash is not None
        and not block.is_null
        and (block.pool is None or block.pool is pool)
    ]


def check_engine(config: PluginConfig, vllm_config: Any, kv_cache_config: Any) -> None:
    """Refuse an engine configuration LPC is not verified with (`engine_checks`, raising
    before vLLM builds anything); log the ones `allow_unverified` lets through."""
    allowed = engine_checks.parse_allowed(config.allow_unverified)
    for item in engine_checks.check_engine(vllm_config, kv_cache_config, allowed):
        logger.warning(
            "LPC eviction runs with %s, which it is not verified with (%s=%s)",
            item.what,
            engine_checks.ALLOW_VARIABLE,
            config.allow_unverified,
        )


def note_engine(runtime: PluginRuntime, vllm_config: Any) -> None:
    """What the runtime reads from the engine's configuration: the CPU tier's connector
    settings, the data-parallel rank (for the first queue this scheduler's pool builds) and
    the metrics' `model_name`."""
    runtime.kv_connector_extra_config = connector_extra_config(vllm_config)
    runtime.queues.vllm_config = vllm_config
    runtime.model_name = model_name_of(vllm_config)


def connector_extra_config(vllm_config: Any) -> dict[str, Any]:
    """The engine's `kv_transfer_config.kv_connector_extra_config` (empty when none)."""
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    extra = getattr(transfer, "kv_connector_extra_config", None)
    return dict(extra) if isinstance(extra, Mapping) else {}


def registered_runtime() -> PluginRuntime | None:
    """The active registration's runtime (None: the plugin is not registered here)."""
    registration = _REGISTRATION
    return None if registration is None else registration.runtime


def make_predictor_client(config: PluginConfig) -> PredictionClient | None:
    """The project's predictor RPC client for `config.predictor_url` (None when unset)."""
    if config.predictor_url is None:
        return None
    try:
        client_module = importlib.import_module("predictor.client")
    except ImportError as error:
        raise PluginConfigError(
            f"LPC_PREDICTOR_URL is {config.predictor_url!r} but the predictor client cannot be "
            f"imported ({error}); install the LPC core into vLLM's environment with its "
            "dependencies (`pip install lpc`: it brings httpx, the client's HTTP library) or unset "
            "LPC_PREDICTOR_URL to use the fallback p only"
        ) from None
    return client_module.PredictorClient(
        config.predictor_url, timeout_s=config.predictor_timeout_s, token=config.predictor_token
    )


# The LPC scheduler classes, as `--scheduler-cls` names them (`vllm_scheduler_class`).
SCHEDULER_CLASS = "lpc.integrations.vllm_scheduler_class.LPCScheduler"
ASYNC_SCHEDULER_CLASS = "lpc.integrations.vllm_scheduler_class.LPCAsyncScheduler"
# The vLLM modules whose shape the plugin checks (`vllm_compat`), by the name the checks use.
VLLM_MODULES = {
    "block_pool": "vllm.v1.core.block_pool",
    "kv_cache_utils": "vllm.v1.core.kv_cache_utils",
    "kv_cache_manager": "vllm.v1.core.kv_cache_manager",
    "request_module": "vllm.v1.request",
    "sampling_params": "vllm.sampling_params",
    "scheduler": "vllm.v1.core.sched.scheduler",
}


def _import_vllm() -> dict[str, Any]:
    names = {"vllm": "vllm", **VLLM_MODULES}
    return {key: importlib.import_module(module) for key, module in names.items()}


def build_runtime(
    config: PluginConfig,
    clock: Clock | None = None,
    predictor_client: PredictionClient | None = None,
    activate: Callable[[], None] | None = None,
    queue_runtime: type[QueueRuntime] = QueueRuntime,
) -> PluginRuntime:
    """What a registration sets up before vLLM builds anything (nothing here imports vLLM):
    the counters, the predictor client and board, the queues' shared runtime, the in-process
    access model and, from its artifact, the model-specific constants the evictor is built
    with."""
    counters = PluginStats()
    client = predictor_client if predictor_client is not None else make_predictor_client(config)
    queues = queue_runtime(
        config,
        counters,
        clock if clock is not None else time.monotonic,
        activate=activate,
        mode=ModeSwitch(config.mode),
    )
    board = (
        PredictionBoard(
            client,
            counters,
            config.max_pending_predictions,
            config.max_prediction_batch,
            on_late=queues.late.deliver,
        )
        if client is not None
        else None
    )
    runtime = PluginRuntime(config, counters, queues, client, board)
    runtime.shadow = ShadowFeed(
        queues.mode,
        counters,
        queues.new_evictor,
        lambda: queues.clock(),  # late-bound: a replay points the queues at its own clock
        learned_name=config.evictor,
    )
    # An injected clock stamps completions too, so arrivals and releases share a timeline.
    runtime.wall_clock = clock or time.time
    returns = load_return_runtime(config, counters)
    runtime.access = load_access_runtime(config, counters, returns)
    if runtime.access is not None and runtime.access.model is not None:
        # Model-specific constants come from the artifact: lpc-pooled's horizon.
        queues.horizon_s = runtime.access.horizon_s
        _note_base_rate(config, runtime.access)
    if config.request_log_dir is not None:
        # An injected clock stamps finish times too, so a replay's log is on its timeline.
        runtime.request_log = PluginRequestLog(config, clock or time.time)
    return runtime


def register() -> None:
    """The `vllm.general_plugins` entry point: it patches nothing in vLLM.

    Opt in (`engine_config`): LPC runs where an engine names its scheduler class
    (`--scheduler-cls`, `vllm_scheduler_class`, which reads the `lpc` table of
    `--additional-config`, else the `LPC_*` environment), or, on a vLLM with the
    eviction-policy seam, where a block pool names the policy `lpc` (`vllm_seam`). `LPC_*`
    settings alone change nothing: they are validated (a bad one raises `PluginConfigError`
    naming it), this says so once, and vLLM runs stock. Never refuses to start otherwise: a
    vLLM whose modules cannot be imported, or whose seam does not fit, runs stock with one
    warning line.

    Idempotent: vLLM may load plugins several times per process.
    """
    global _STOCK_REASON, _SAID_ENVIRONMENT
    with _LOCK:
        if _REGISTRATION is not None or _STOCK_REASON is not None:
            return  # said once; vLLM calls plugins again in this process
        try:
            modules = _import_vllm()
        except Exception as error:  # not the vLLM it was built for: stock, said once
            _STOCK_REASON = f"vLLM's modules cannot be imported ({error!r})"
            logger.warning("LPC eviction is off, vLLM runs stock: %s", _STOCK_REASON)
            return
        if vllm_compat.has_seam(modules["block_pool"]):
            _register_seam(modules)
            return
        if configured_by_environment(os.environ) and not _SAID_ENVIRONMENT:
            load_config()  # validated where vLLM starts: a bad field stops it, named
            _SAID_ENVIRONMENT = True
            logger.info(
                "LPC_* settings found; the LPC plugin patches nothing in vLLM: they take effect "
                "where the engine names --scheduler-cls %s (%s with async scheduling), and vLLM "
                "runs stock elsewhere",
                SCHEDULER_CLASS,
                ASYNC_SCHEDULER_CLASS,
            )


def _install(
    modules: dict[str, Any],
    config: PluginConfig,
    clock: Clock | None,
    predictor_client: PredictionClient | None,
    seam: bool = False,
) -> None:
    """Build the runtime and register it (under `_LOCK`, nothing registered yet); nothing in
    vLLM is patched: the scheduler class (`vllm_scheduler_class`) or, with the `seam`, vLLM's
    eviction-policy factory (`vllm_seam`) builds the queue and calls it."""
    global _REGISTRATION
    runtime = build_runtime(
        config,
        clock,
        predictor_client,
        # Late-bound: the registration is complete before any queue is built.
        activate=lambda: _activate(registration),
        queue_runtime=vllm_seam.SeamQueueRuntime if seam else QueueRuntime,
    )
    queues = runtime.queues
    registration = _Registration(runtime)
    _REGISTRATION = registration
    logger.info(
        "LPC eviction plugin registered in vLLM %s (pid %d): %s",
        modules["vllm"].__version__,
        os.getpid(),
        ", ".join(
            f"{k}={v}"
            for k, v in {**config.as_dict(), "horizon_s": queues.evictor_horizon_s}.items()
        ),
    )


def _register_seam(modules: dict[str, Any]) -> None:
    """vLLM has the eviction-policy seam: register the LPC queue as its policy `lpc` and patch
    nothing (`vllm_seam`). Configured by the `LPC_*` environment, the runtime is built now;
    else when a pool configured with `eviction_policy="lpc"` builds its queue
    (`seam_runtime`). A seam of another shape: stock, said once (under `_LOCK`)."""
    global _STOCK_REASON
    problems = vllm_seam.seam_problems(modules)
    if problems:
        _STOCK_REASON = "the LPC plugin does not fit this vLLM's eviction-policy seam: " + (
            "; ".join(problems)
        )
        logger.warning("LPC eviction is off, vLLM runs stock: %s", _STOCK_REASON)
        return
    vllm_seam.register_seam(modules["block_pool"])
    _SEAM["modules"] = modules
    if configured_by_environment(os.environ):
        _install_seam(load_config())


def _install_seam(config: PluginConfig) -> None:
    """The seam path's registration (under `_LOCK`, nothing registered yet)."""
    missing = vllm_seam.unsupported_by_seam(config)
    if missing:
        logger.warning("LPC through vLLM's eviction-policy seam leaves out: %s", "; ".join(missing))
    _install(_SEAM["modules"], config, None, None, seam=True)


def seam_runtime() -> PluginRuntime:
    """The runtime an LPC queue built by vLLM's `EvictionPolicyFactory` uses: the registered
    one, else one installed now from the `LPC_*` environment (the pool's `eviction_policy`
    named LPC, which is the opt-in)."""
    with _LOCK:
        if _REGISTRATION is None:
            if not _SEAM:  # resolved by module path, the plugin not loaded by vLLM
                _SEAM["modules"] = _import_vllm()
            _install_seam(load_config())
        assert _REGISTRATION is not None
        return _REGISTRATION.runtime


def install_runtime(
    config: PluginConfig,
    clock: Clock | None = None,
    predictor_client: PredictionClient | None = None,
) -> PluginRuntime:
    """The runtime of the LPC scheduler class (`vllm_scheduler_class`), registered so that
    the metrics, the kill switch and the CPU tier's policy find it; an earlier registration
    of this process is shared (its configuration stands). `clock` and `predictor_client`
    replace the process's (replays and tests)."""
    with _LOCK:
        registration = _REGISTRATION
        if registration is None:
            _install(_import_vllm(), config, clock, predictor_client)
            assert _REGISTRATION is not None
            return _REGISTRATION.runtime
        if registration.runtime.config != config:
            logger.warning(
                "LPC: a second engine of pid %d is configured differently; the first one's "
                "configuration stands for both",
                os.getpid(),
            )
        return registration.runtime


def _note_base_rate(config: PluginConfig, access: AccessRuntime) -> None:
    """Point out a fallback p left at its default while the model knows its base rate (the
    fallback stays what the operator configured: it is a setting, not the model's)."""
    base_rate = access.base_rate
    if (
        config.fallback_probability == DEFAULT_FALLBACK_PROBABILITY
        and base_rate is not None
        and abs(base_rate - config.fallback_probability) > 0.05
    ):
        logger.info(
            "LPC: fallback_probability is the default %g; the access model's training base "
            "rate is %.3f (set LPC_FALLBACK_P to it to use it)",
            config.fallback_probability,
            base_rate,
        )


def _activate(registration: _Registration) -> None:
    """Called when the first LPC queue is built, i.e. in the process that owns the KV cache.

    vLLM loads plugins in every process (API server, engine core, workers); only the engine
    core builds block pools, so the metrics server starts here rather than in `register()`.
    """
    runtime = registration.runtime
    config = runtime.config
    engine = runtime.queues.engine
    if runtime.access is not None:
        runtime.access.block_size = engine.hash_block_size
        runtime.access.start_background()  # reloads and token compaction, off this thread
    if registration.metrics is None:
        # vLLM's /metrics when it reads multiprocess files, else the plugin's own port (each
        # data-parallel engine core on the port offset by its rank); `metrics` says why.
        registration.metrics = start_export(
            stats_snapshot, config.metrics_host, config.metrics_port, engine.data_parallel_rank
        )
    if config.control_file is not None and registration.control is None:
        # A background thread reads the file: the scheduler thread only compares the mode.
        watcher = ControlFileWatcher(
            config.control_file, registration.runtime.queues.mode, config.control_poll_s
        )
        watcher.start()
        registration.control = watcher
    logger.info(
        "LPC eviction active in pid %d, mode %s (data-parallel rank %d from the %s; hash block "
        "size %s)",
        os.getpid(),
        registration.runtime.queues.mode.mode,
        engine.data_parallel_rank,
        engine.rank_source,
        engine.hash_block_size,
    )


def unregister() -> None:
    """Forget the registration: its background work stopped, its export closed (tests, or a
    process switching modes); pools built from now on are stock."""
    global _REGISTRATION, _STOCK_REASON
    with _LOCK:
        registration = _REGISTRATION
        _STOCK_REASON = None
        if registration is None:
            return
        if registration.runtime.board is not None:
            registration.runtime.board.close()
        if registration.runtime.access is not None:
            registration.runtime.access.stop_background()
        if registration.metrics is not None:
            registration.metrics.close()
        if registration.control is not None:
            registration.control.close()
        if registration.runtime.shadow is not None:
            registration.runtime.shadow.close()
        if registration.runtime.request_log is not None:
            registration.runtime.request_log.close()
        _REGISTRATION = None


def is_registered() -> bool:
    return _REGISTRATION is not None


def flush_request_log(timeout_s: float = 5.0) -> bool:
    """Wait until the request log has written (or dropped) every finished request so far."""
    registration = _REGISTRATION
    if registration is None or registration.runtime.request_log is None:
        return True
    return registration.runtime.request_log.flush(timeout_s)


def set_mode(mode: str, source: str = "set_mode()") -> bool:
    """Switch the running engine to `mode` (lpc, lru or shadow), from any thread; each free
    queue applies it at its next pop. True when the mode changed; ValueError for no mode."""
    registration = _REGISTRATION
    if registration is None:
        raise RuntimeError("the LPC plugin is not registered")
    return registration.runtime.queues.mode.set(mode, source)


def drain_shadow(timeout_s: float = 30.0) -> bool:
    """Wait until the shadow caches applied every request noted so far (False on timeout)."""
    registration = _REGISTRATION
    if registration is None or registration.runtime.shadow is None:
        return True
    return registration.runtime.shadow.drain(timeout_s)


def stats_snapshot() -> dict[str, Any]:
    """The plugin's counters, the predictor client's own counters and the configuration."""
    registration = _REGISTRATION
    if registration is None:
        return {"registered": False}
    runtime = registration.runtime
    out: dict[str, Any] = {"registered": True, **runtime.stats.snapshot()}
    if runtime.request_log is not None:
        out.update({f"request_log_{k}": v for k, v in runtime.request_log.counters().items()})
    board = runtime.board
    if runtime.access is not None:
        out.update(runtime.access.counters())
    out["pending_predictions"] = board.pending if board is not None else 0
    out["predictions_in_flight"] = board.in_flight if board is not None else 0
    client_stats = getattr(runtime.client, "stats", None)
    if client_stats is not None and hasattr(client_stats, "as_dict"):
        out["predictor_client"] = client_stats.as_dict()
    queues = runtime.queues
    out["evictor_horizon_s"] = queues.evictor_horizon_s
    out["dp_rank"] = queues.engine.data_parallel_rank
    out["model_name"] = runtime.model_name
    out["memory_bytes"] = memory_bytes(plugin_structures(runtime))
    if queues.evictor is not None:
        out.update(gate_state(queues.evictor))
        out.update(window_state(queues.evictor))
    cpu_policy = runtime.cpu_tier_policy
    if cpu_policy is not None:
        out.update(window_state(getattr(cpu_policy, "evictor", None), "cpu_"))
    out["histograms"] = {k: v.as_dict() for k, v in queues.histograms.snapshot().items()}
    out.update(queues.mode.counters())
    if runtime.shadow is not None:
        out.update(runtime.shadow.counters_dict())
    out["config"] = runtime.config.as_dict()
    return out
