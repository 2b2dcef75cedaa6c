"""An access-only model inside the plugin: a probability per release, in process, no RPC.

At a release the plugin builds the request's `RequestState` and reads its conversation's
`ConversationState` from the `ConversationTable`; the registry's engine-state forms
(`predictor.access_features`) turn them into the model's inputs, and `AccessPredictor`
computes p in microseconds. Feature code is never duplicated here. A background thread reloads
a promoted model and compacts the table's tokens, so the release path does no file I/O; with a
return-time model loaded (`return_runtime`) the same release also gives its return curve.

Reload, model constants and failures: docs/design.md, "The access runtime".
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from lpc.integrations.artifact_folders import (
    PROBE_REQUEST,
    ArtifactPointer,
    LoadedArtifact,
    PromotionWatch,
    load_configured,
    resolve_artifact,
)
from lpc.integrations.config import PluginConfig, PluginConfigError
from lpc.integrations.conversation_table import (
    EMPTY_CONVERSATION,
    ConversationTable,
    StoredSequence,
    shared_prefix,
)
from lpc.integrations.stats import PluginStats, is_probability
from predictor.access_features import ConversationState, RequestState
from predictor.access_predictor import AccessPredictor
from predictor.artifact import read_metadata
from predictor.errors import UserError

if TYPE_CHECKING:
    from lpc.integrations.return_runtime import ReturnModelRuntime
    from predictor.return_curve import ReturnCurve

logger = logging.getLogger("vllm.plugins.lpc")

REQUEST_TYPE_KEY = "lpc_request_type"  # as the request log reads it
# How often the background thread wakes to compact stored token sequences (and to see whether
# a reload check is due): a sequence stays referenced, not compacted, at most about this long.
BACKGROUND_TICK_S = 0.05


def reads_text(path: Path) -> bool:
    """Whether the artifact at `path` also reads a text window (served through the RPC)."""
    return bool(read_metadata(resolve_artifact(path)).inputs.text_window)


def request_tokens(request: Any) -> Any:
    """The sequence a request's shared prefix reads (its first `num_prompt_tokens`): vLLM's
    prompt list, else the request's `all_token_ids`. Referenced, not copied."""
    prompt = getattr(request, "prompt_token_ids", None)
    return prompt if isinstance(prompt, list) else request.all_token_ids


# The loaded access model, published to the release path with one assignment.
LoadedModel = LoadedArtifact[AccessPredictor]


@dataclass(slots=True)
class ReleaseOutcome:
    """What the in-process models made of one release: the access model's p (None: no model,
    not asked, or `error`, what it raised) and the return model's checked curve (None: no
    model, or the fallback score)."""

    probability: float | None = None
    error: Exception | None = None
    curve: ReturnCurve | None = None


class ReleaseItem(NamedTuple):
    """One request of `AccessRuntime.release_many`: `release`'s arguments."""

    request: Any
    conversation_id: str | None
    completion_s: float
    prompt_tokens: int
    predict: bool = True


@dataclass
class AccessRuntime:
    """The loaded access model and return-time model (either may be absent), their
    conversation table and their background reloader."""

    path: Path | None  # as configured (None: no access model)
    model: LoadedModel | None
    table: ConversationTable
    stats: PluginStats
    reload_s: float
    returns: ReturnModelRuntime | None = None  # the return-time model, if one is loaded
    started_horizon_s: float | None = None  # the first model's: the evictor's horizon
    # vLLM's hash block size (tokens per entry of `Request.block_hashes`), learned from the
    # block pool; None: the shared prefix is found by comparing tokens only.
    block_size: int | None = None
    # Stored sequences the background thread compacts (append/popleft: thread-safe).
    _to_compact: deque[StoredSequence] = field(default_factory=deque, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _check_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.started_horizon_s = self.horizon_s
        self._watch = (
            None
            if self.path is None
            else PromotionWatch(self.path, "access model", "access_model_reload_failures")
        )

    @classmethod
    def load(
        cls,
        config: PluginConfig,
        stats: PluginStats,
        returns: ReturnModelRuntime | None = None,
        with_access_model: bool = True,
    ) -> AccessRuntime:
        """Load `config.access_model` (unless `with_access_model` is False: the return model
        only); one `PluginConfigError` naming the setting and path."""
        path = model = None
        if with_access_model:
            assert config.access_model is not None
            path = Path(config.access_model)
            model = load_configured(
                config.access_model,
                "LPC_ACCESS_MODEL (access_model)",
                "an access-only model",
                load_checked,
            )
        table = ConversationTable(
            config.conversation_table_size,
            config.conversation_expiry_s,
            config.conversation_table_max_tokens,
        )
        return cls(path, model, table, stats, config.access_model_reload_s, returns=returns)

    @property
    def predictor(self) -> AccessPredictor:
        assert self.model is not None, "no access model is loaded"
        return self.model.predictor

    @property
    def pointer(self) -> ArtifactPointer:
        assert self.model is not None, "no access model is loaded"
        return self.model.pointer

    @property
    def needs_tokens(self) -> bool:
        """Whether a loaded model reads a feature that needs token ids (the shared prefix)."""
        model, returns = self.model, self.returns
        return (model is not None and model.needs_tokens) or (
            returns is not None and returns.needs_tokens
        )

    @property
    def horizon_s(self) -> float | None:
        """The loaded access model's label horizon from its metadata (None: no access model,
        not recorded, or not a finite number > 0)."""
        return None if self.model is None else _positive(self.predictor.horizon_s)

    @property
    def base_rate(self) -> float | None:
        return None if self.model is None else self.predictor.metadata.base_rate

    # -- off the scheduler thread ----------------------------------------------------------
    def start_background(self) -> None:
        """Start the daemon thread that reloads promoted models and compacts stored tokens
        (idempotent; in the process that owns the KV cache)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._background, name="lpc-access-model", daemon=True
        )
        self._thread.start()

    def stop_background(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        self._thread = None

    def _background(self) -> None:
        stop = self._stop
        returns = self.returns
        # (interval, check, next due) per loaded model; each was just loaded at startup.
        checks = []
        if self.model is not None and self.reload_s:
            checks.append([self.reload_s, self.check_for_promoted_model, self.reload_s])
        if returns is not None and returns.reload_s:
            checks.append([returns.reload_s, returns.check_for_promoted_model, returns.reload_s])
        clock = 0.0
        while not stop.is_set():
            try:
                self.compact_pending()
                for check in checks:
                    if clock >= check[2]:
                        check[2] = clock + check[0]
                        check[1]()
            except Exception as error:  # never let the thread die: count and go on
                self.stats.plugin_error("the access model's background thread", error)
            stop.wait(BACKGROUND_TICK_S)
            clock += BACKGROUND_TICK_S

    def compact_pending(self) -> int:
        """Compact the token sequences stored since the last call; how many."""
        queue = self._to_compact
        done = 0
        while queue:
            queue.popleft().compact()
            done += 1
        return done

    def check_for_promoted_model(self) -> None:
        """One reload check, now: swap in a newly promoted model if one has appeared. Never
        raises: anything wrong with the folder keeps the old model and is counted once per
        state of the folder (`access_model_reload_failures`). Checks run one at a time."""
        with self._check_lock:
            self._check()

    def _check(self) -> None:
        current = self.model
        if current is None or self._watch is None:
            return  # no access model: nothing to reload
        promoted = self._watch.poll(current.pointer, load_checked, self.stats)
        if promoted is None:
            return
        pointer, predictor = promoted
        horizon_s = _positive(predictor.horizon_s)
        if horizon_s != self.started_horizon_s:
            logger.warning(
                "access model %s: label horizon %s s, the first model's was %s s; the evictor "
                "keeps the horizon it started with until vLLM restarts",
                pointer[0],
                horizon_s,
                self.started_horizon_s,
            )
        self.model = LoadedModel.of(predictor, pointer)
        self.stats.add(access_model_reloads=1)
        logger.info("access model reloaded from %s", pointer[0])

    # -- the release path -------------------------------------------------------------------
    def predict_release(
        self, request: Any, conversation_id: str | None, completion_s: float, prompt_tokens: int
    ) -> float:
        """p of a request releasing its blocks at `completion_s` (what the access model
        raised, raised); a finished request then becomes its conversation's latest (a
        preempted one comes back and is not recorded)."""
        outcome = self.release(request, conversation_id, completion_s, prompt_tokens)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.probability is not None, "no access model is loaded"
        return outcome.probability

    def release(
        self,
        request: Any,
        conversation_id: str | None,
        completion_s: float,
        prompt_tokens: int,
        predict: bool = True,
    ) -> ReleaseOutcome:
        """What the models make of a request releasing its blocks at `completion_s`: the
        access model's p (with `predict`, when one is loaded) and the return model's curve
        (when one is loaded), both from one `RequestState` of the request and its
        conversation's table entry. A finished request then becomes its conversation's latest.
        Raises only when the request cannot be read; a model's failure is in the outcome."""
        outcome = ReleaseOutcome()
        predict = predict and self.model is not None
        if predict or conversation_id or self.returns is not None:
            self._release(request, conversation_id, completion_s, prompt_tokens, predict, outcome)
        return outcome

    def record_release(
        self, request: Any, conversation_id: str | None, completion_s: float, prompt_tokens: int
    ) -> ReturnCurve | None:
        """Keep a finished request's conversation history complete when its p came from
        elsewhere (the request's own `lpc_probability`): no p is predicted; the return
        model's curve (None without one)."""
        return self.release(request, conversation_id, completion_s, prompt_tokens, False).curve

    def release_many(self, items: Sequence[ReleaseItem]) -> list[ReleaseOutcome | None]:
        """`release` for several requests in order (those a scheduler step finishes), each
        model run once for all: the access model's p in one forward pass
        (`AccessPredictor.predict_rows`), the return model's curves in another
        (`ReturnModelRuntime.curves`). Each request's state is read after the previous one was
        recorded, as one by one. None for a request that cannot be read (nothing recorded:
        its own `release` raises)."""
        if len(items) == 1:  # the common step: `release` itself, `predict_one`'s p
            try:
                return [self.release(*items[0])]
            except Exception:
                return [None]
        model, returns = self.model, self.returns  # read once: a reload publishes a new one
        outcomes: list[ReleaseOutcome | None] = []
        rows: list[list[float]] = []
        predicted: list[ReleaseOutcome] = []
        curved: list[tuple[ReleaseOutcome, RequestState, ConversationState]] = []
        for item in items:
            predict = item.predict and model is not None
            outcome = ReleaseOutcome()
            if not (predict or item.conversation_id or returns is not None):
                outcomes.append(outcome)  # nothing to compute or record, as in `release`
                continue
            try:
                state, conversation = self._read(*item[:4])
            except Exception:
                outcomes.append(None)
                continue
            if predict:
                assert model is not None
                try:
                    rows.append(model.predictor.state_row(state, conversation))
                    predicted.append(outcome)
                except Exception as error:
                    outcome.error = error
            if returns is not None:
                curved.append((outcome, state, conversation))
            self._record(
                item.request, item.conversation_id, item.completion_s, state, conversation, None
            )
            outcomes.append(outcome)
        if curved:
            assert returns is not None
            curves = returns.curves([(state, conversation) for _, state, conversation in curved])
            for (outcome, _, _), curve in zip(curved, curves, strict=True):
                outcome.curve = curve
        if rows:
            assert model is not None
            self.stats.add(in_process_scoring_calls=1)
            try:
                probabilities = model.predictor.predict_rows(rows)
            except Exception as error:  # the plugin counts it per release
                for outcome in predicted:
                    outcome.error = error
            else:
                for outcome, probability in zip(predicted, probabilities, strict=True):
                    outcome.probability = probability
        return outcomes

    def _release(
        self,
        request: Any,
        conversation_id: str | None,
        completion_s: float,
        prompt_tokens: int,
        predict: bool,
        outcome: ReleaseOutcome,
    ) -> None:
        model = self.model  # read once: a reload publishes a new one
        state, conversation = self._read(request, conversation_id, completion_s, prompt_tokens)
        if predict and model is not None:
            self.stats.add(in_process_scoring_calls=1)
            try:
                outcome.probability = model.predictor.predict_one(state, conversation)
            except Exception as error:  # the plugin counts it; the curve and table go on
                outcome.error = error
        self._record(request, conversation_id, completion_s, state, conversation, outcome)

    def _read(
        self, request: Any, conversation_id: str | None, completion_s: float, prompt_tokens: int
    ) -> tuple[RequestState, ConversationState]:
        """The request's `RequestState` and its conversation's state before it (raises when
        the request cannot be read)."""
        entry = self.table.entry(conversation_id, completion_s) if conversation_id else None
        conversation = entry.state if entry is not None else EMPTY_CONVERSATION
        shared = 0
        if self.needs_tokens and entry is not None and entry.previous is not None:
            hashes = getattr(request, "block_hashes", None)
            shared = shared_prefix(
                entry.previous,
                request_tokens(request),
                prompt_tokens,
                hashes if isinstance(hashes, list) else (),
                self.block_size,
            )
        params = request.sampling_params
        extra = params.extra_args if params is not None else None
        kind = extra.get(REQUEST_TYPE_KEY) if isinstance(extra, dict) else None
        state = RequestState(
            float(request.arrival_time),
            prompt_tokens,
            shared,
            int(request.num_output_tokens),
            completion_s,
            kind if isinstance(kind, str) else None,
        )
        return state, conversation

    def _record(
        self,
        request: Any,
        conversation_id: str | None,
        completion_s: float,
        state: RequestState,
        conversation: ConversationState,
        outcome: ReleaseOutcome | None,
    ) -> None:
        """The return model's curve into `outcome` (None: the caller computes it); a
        finished request becomes its conversation's latest."""
        returns = self.returns
        if returns is not None and outcome is not None:
            outcome.curve = returns.curve(state, conversation)  # never raises
        # Recorded even when a model fails, so the conversation's history stays whole; a
        # failure to record costs the history, not the prediction.
        is_finished = getattr(request, "is_finished", None)
        if conversation_id and (is_finished is None or is_finished()):
            try:
                stored = StoredSequence.of_request(request) if self.needs_tokens else None
                self.table.finished(conversation_id, state, completion_s, stored)
                if stored is not None:
                    self._to_compact.append(stored)
            except Exception as error:
                self.stats.plugin_error("recording a request in the conversation table", error)

    def counters(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.table.counters())
        if self.model is not None:
            out["access_model_path"] = self.pointer[0]
        if self.returns is not None:
            out.update(self.returns.counters())
        return out


def _positive(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) and value > 0 else None


def load_checked(folder: str | Path) -> AccessPredictor:
    """`AccessPredictor.load`, refusing (ValueError) a model whose p for a probe request is
    not a finite number in [0, 1]: it would predict garbage for every request."""
    predictor = AccessPredictor.load(folder)
    probe = predictor.predict_one(PROBE_REQUEST, EMPTY_CONVERSATION)
    if not is_probability(probe):
        raise ValueError(
            f"artifact {folder}: its probability for a probe request is {probe!r}, not a "
            "finite number in [0, 1] (weights not finite?)"
        )
    return predictor


def load_access_runtime(
    config: PluginConfig, stats: PluginStats, returns: ReturnModelRuntime | None = None
) -> AccessRuntime | None:
    """The in-process models: the access model `config` names and the loaded return-time
    model `returns`, with their conversation table; None when neither runs in process (no
    access model named, or one that reads text too: it is served through the predictor RPC,
    which must then be configured)."""
    if config.access_model is None:
        if returns is None:
            return None
        return AccessRuntime.load(config, stats, returns, with_access_model=False)
    path = Path(config.access_model)
    try:
        text = reads_text(path)
    except (OSError, UserError, ValueError) as error:
        raise PluginConfigError(
            f"LPC_ACCESS_MODEL (access_model) = {config.access_model!r}: cannot read the "
            f"artifact there ({error})"
        ) from None
    if text:
        if config.predictor_url is None:
            raise PluginConfigError(
                f"LPC_ACCESS_MODEL (access_model) = {config.access_model!r} reads a text "
                "window: it is served by `lpc serve`; set LPC_PREDICTOR_URL to it"
            )
        logger.info("model %s reads text: predictions through the predictor RPC", path)
        if returns is None:
            return None
        return AccessRuntime.load(config, stats, returns, with_access_model=False)
    return AccessRuntime.load(config, stats, returns)
