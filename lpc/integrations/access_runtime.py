"""An access-only model inside the plugin: a probability per release, in process, no RPC.

At a release the plugin builds the request's `RequestState` from vLLM's request (arrival,
prompt and output tokens, the prefix it shares with its conversation's previous request) and
reads the `ConversationState` its conversation's finished requests left in the
`ConversationTable`; the registry's engine-state forms (`predictor.access_features`) turn them
into the model's inputs, and `AccessPredictor` computes p in microseconds. Feature code is
never duplicated here.

Reload, off the scheduler thread: the configured path is an artifact folder or a registry
folder (its `current` link is followed, as `training.registry` promotes by repointing it). A
daemon thread (`start_background`, started where the engine's first LPC queue is built) looks
every `reload_s` seconds at the resolved folder and its files' modification times; on a change
it loads the new model (about a millisecond: numpy, no torch), probes it and publishes it with
one assignment (`LoadedModel`). The release path only reads the current `LoadedModel`: no
`stat`, no file I/O, no load. A failed load keeps the old model, counts
`access_model_reload_failures` and warns once per failed artifact. "Failed" covers whatever the
folder holds: missing or garbage files, a file where the folder was, an artifact that loads but
whose p on a probe request is not a finite number in [0, 1] (e.g. NaN weights; at startup such
a model is refused like a corrupt one). `check_for_promoted_model()` is one such check, run
synchronously (what the thread runs; tests call it to reload deterministically). The same
thread compacts the token sequences the conversation table keeps (`conversation_table`), so
the release path never converts tokens either.

Model-specific constants come from the loaded artifact's metadata: `horizon_s` (its label
horizon, `inputs.horizon_s`) is what `lpc-pooled` judges reuse and the model over, and
`base_rate` its training base rate. A promoted model with another horizon is used, but the
evictor keeps the horizon it was built with until the engine restarts (a warning says so).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lpc.integrations.config import PluginConfig, PluginConfigError
from lpc.integrations.conversation_table import (
    EMPTY_CONVERSATION,
    ConversationTable,
    StoredSequence,
    shared_prefix,
)
from lpc.integrations.stats import PluginStats, is_probability
from predictor.access_features import RequestState, feature
from predictor.access_predictor import AccessPredictor
from predictor.artifact import METADATA_FILE, WEIGHTS_FILE, read_metadata
from predictor.errors import UserError

logger = logging.getLogger("vllm.plugins.lpc")

REQUEST_TYPE_KEY = "lpc_request_type"  # as the request log reads it
# (resolved folder, metadata mtime in ns, weights mtime in ns): a change of either file, e.g.
# a folder overwritten in place, is looked at (and a half-copied one retried once complete).
ArtifactPointer = tuple[str, int, int]
UNREADABLE_MTIME = -1  # an ArtifactPointer's mtimes when the configured path cannot be read
# A request and conversation every model must give a probability for (a sound model does).
PROBE_REQUEST = RequestState(0.0, 1000, 0, 100, 10.0)
# How often the background thread wakes to compact stored token sequences (and to see whether
# a reload check is due): a sequence stays referenced, not compacted, at most about this long.
BACKGROUND_TICK_S = 0.05


def resolve_artifact(path: Path) -> Path:
    """The artifact folder `path` names: a registry's `current`, or `path` itself."""
    current = path / "current"
    if current.is_symlink() or (current.is_dir() and not (path / METADATA_FILE).exists()):
        return current.resolve()
    return path.resolve()


def artifact_pointer(path: Path) -> ArtifactPointer:
    folder = resolve_artifact(path)
    metadata_ns = (folder / METADATA_FILE).stat().st_mtime_ns
    return str(folder), metadata_ns, (folder / WEIGHTS_FILE).stat().st_mtime_ns


def reads_text(path: Path) -> bool:
    """Whether the artifact at `path` also reads a text window (served through the RPC)."""
    return bool(read_metadata(resolve_artifact(path)).inputs.text_window)


def request_tokens(request: Any) -> Any:
    """The sequence a request's shared prefix reads (its first `num_prompt_tokens`): vLLM's
    prompt list, else the request's `all_token_ids`. Referenced, not copied."""
    prompt = getattr(request, "prompt_token_ids", None)
    return prompt if isinstance(prompt, list) else request.all_token_ids


@dataclass(frozen=True)
class LoadedModel:
    """A loaded access model and what the release path needs to know about it, published to
    the release path with one assignment."""

    predictor: AccessPredictor
    pointer: ArtifactPointer
    # Whether it reads a feature whose engine-state form needs token ids (the shared prefix),
    # as its registry record says.
    needs_tokens: bool

    @classmethod
    def of(cls, predictor: AccessPredictor, pointer: ArtifactPointer) -> LoadedModel:
        needs = any(feature(n).needs_token_ids for n in predictor.feature_names)
        return cls(predictor, pointer, needs)


@dataclass
class AccessRuntime:
    """The loaded access model, its conversation table and its background reloader."""

    path: Path  # as configured
    model: LoadedModel
    table: ConversationTable
    stats: PluginStats
    reload_s: float
    failed_pointer: ArtifactPointer | None = None
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

    @classmethod
    def load(cls, config: PluginConfig, stats: PluginStats) -> AccessRuntime:
        """Load `config.access_model`; one `PluginConfigError` naming the setting and path."""
        assert config.access_model is not None
        path = Path(config.access_model)
        try:
            pointer = artifact_pointer(path)
            predictor = load_checked(pointer[0])
        except (OSError, UserError, ValueError) as error:
            raise PluginConfigError(
                f"LPC_ACCESS_MODEL (access_model) = {config.access_model!r}: cannot load an "
                f"access-only model there ({error})"
            ) from None
        table = ConversationTable(
            config.conversation_table_size,
            config.conversation_expiry_s,
            config.conversation_table_max_tokens,
        )
        model = LoadedModel.of(predictor, pointer)
        return cls(path, model, table, stats, config.access_model_reload_s)

    @property
    def predictor(self) -> AccessPredictor:
        return self.model.predictor

    @property
    def pointer(self) -> ArtifactPointer:
        return self.model.pointer

    @property
    def needs_tokens(self) -> bool:
        return self.model.needs_tokens

    @property
    def horizon_s(self) -> float | None:
        """The loaded model's label horizon from its metadata (None: not recorded, or not a
        finite number > 0)."""
        return _positive(self.predictor.horizon_s)

    @property
    def base_rate(self) -> float | None:
        return self.predictor.metadata.base_rate

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
        next_check = 0.0
        clock = 0.0
        while not stop.is_set():
            try:
                self.compact_pending()
                if self.reload_s and clock >= next_check:
                    next_check = clock + self.reload_s
                    if clock > 0.0:  # the model was just loaded at startup
                        self.check_for_promoted_model()
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
        try:
            pointer = artifact_pointer(self.path)
        except Exception as error:  # gone, or a file where the folder was
            pointer = (str(self.path), UNREADABLE_MTIME, UNREADABLE_MTIME)
            if pointer != self.failed_pointer:
                self._reload_failed(pointer, error)
            return
        if pointer == current.pointer or pointer == self.failed_pointer:
            return
        try:
            predictor = load_checked(pointer[0])
        except Exception as error:
            self._reload_failed(pointer, error)
            return
        horizon_s = _positive(predictor.horizon_s)
        if horizon_s != self.started_horizon_s:
            logger.warning(
                "access model %s: label horizon %s s, the first model's was %s s; the evictor "
                "keeps the horizon it started with until vLLM restarts",
                pointer[0],
                horizon_s,
                self.started_horizon_s,
            )
        self.model, self.failed_pointer = LoadedModel.of(predictor, pointer), None
        self.stats.add(access_model_reloads=1)
        logger.info("access model reloaded from %s", pointer[0])

    def _reload_failed(self, pointer: ArtifactPointer, error: BaseException) -> None:
        self.failed_pointer = pointer
        self.stats.add(access_model_reload_failures=1)
        logger.warning(
            "access model %s: cannot load %s, keeping %s (%s)",
            self.path,
            pointer[0],
            self.pointer[0],
            error,
        )

    # -- the release path -------------------------------------------------------------------
    def predict_release(
        self, request: Any, conversation_id: str | None, completion_s: float, prompt_tokens: int
    ) -> float:
        """p of a request releasing its blocks at `completion_s`; a finished request then
        becomes its conversation's latest (a preempted one comes back and is not recorded)."""
        return self._release(request, conversation_id, completion_s, prompt_tokens, True)

    def record_release(
        self, request: Any, conversation_id: str | None, completion_s: float, prompt_tokens: int
    ) -> None:
        """Keep a finished request's conversation history complete when its p came from
        elsewhere (the request's own `lpc_probability`): nothing is predicted."""
        if conversation_id:
            self._release(request, conversation_id, completion_s, prompt_tokens, False)

    def _release(
        self,
        request: Any,
        conversation_id: str | None,
        completion_s: float,
        prompt_tokens: int,
        predict: bool,
    ) -> float:
        model = self.model  # read once: a reload publishes a new one
        table = self.table
        entry = table.entry(conversation_id, completion_s) if conversation_id else None
        conversation = entry.state if entry is not None else EMPTY_CONVERSATION
        shared = 0
        if model.needs_tokens and entry is not None and entry.previous is not None:
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
        try:
            probability = model.predictor.predict_one(state, conversation) if predict else 0.0
        finally:
            # Recorded even when the model fails, so the conversation's history stays whole;
            # a failure to record costs the history, not the prediction.
            is_finished = getattr(request, "is_finished", None)
            if conversation_id and (is_finished is None or is_finished()):
                try:
                    stored = StoredSequence.of_request(request) if model.needs_tokens else None
                    table.finished(conversation_id, state, completion_s, stored)
                    if stored is not None:
                        self._to_compact.append(stored)
                except Exception as error:
                    self.stats.plugin_error("recording a request in the conversation table", error)
        return probability

    def counters(self) -> dict[str, Any]:
        return {**self.table.counters(), "access_model_path": self.pointer[0]}


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


def load_access_runtime(config: PluginConfig, stats: PluginStats) -> AccessRuntime | None:
    """The in-process access model `config` names, or None: none named, or the artifact reads
    text too (it is served through the predictor RPC, which must then be configured)."""
    if config.access_model is None:
        return None
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
        return None
    return AccessRuntime.load(config, stats)
