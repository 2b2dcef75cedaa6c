"""The daily retraining job: select logs, train a candidate, judge it, promote or keep.

One run, under the registry's lock: clean up, pick the logs (`training.log_files`), train a
candidate, score it and the current model on the same held-out samples, promote it unless it
is worse by more than `tolerance`, publish it either way, and tell a running `lpc serve` to
reload. Models are plug-ins (`training.model_kinds`); trace files are a `LogTrainer`'s, injected
by the caller (`lpc.access.log_retrain`). Outcome statuses map to exit codes (`EXIT_CODES`).

The steps, the followers and the exit codes: docs/design.md, "The daily job".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from predictor.artifact import ArtifactError
from predictor.client import check_predictor_url
from predictor.embedders.base import Embedder
from predictor.errors import InvalidInputError, UserError
from training.conversation import Conversation
from training.embedding_cache import EmbeddingCache, EmbedOptions
from training.log_files import LogFile, LogSelection, discover_logs, select_logs
from training.model_kinds import (
    DEFAULT_KEEP_VERSIONS,
    DEFAULT_MIN_EVALUATION_SAMPLES,
    FollowerKind,
    KindOutcome,
    clean_leftovers,
    publish_and_record,
    run_follower,
)
from training.model_kinds import FAILED as FOLLOWER_FAILED
from training.model_registry import ModelRegistry, RegistryLockedError, now_iso
from training.pipeline import TrainConfig, evaluate_artifact, train_predictor
from training.promotion import Decision, decide
from training.return_retrain import (
    ReturnModelKind,
    ReturnRetrainConfig,
    ReturnTrainer,
    SplitHandoff,
    train_return_candidate,
)
from training.samples import TokenCounter

PROMOTED, KEPT, NO_NEW_DATA, LOCKED, FAILED = "promoted", "kept", "no_new_data", "locked", "failed"
BAD_INPUT = "bad_input"
EXIT_CODES = {PROMOTED: 0, FAILED: 1, BAD_INPUT: 2, KEPT: 3, NO_NEW_DATA: 4, LOCKED: 5}
METRICS = ("roc_auc", "mcc", "macro_f1")

Log = Callable[[str], None]
EmbedderLoader = Callable[[str], Embedder]


@dataclass
class AccessCandidate:
    """A trained access or text candidate, and the current model scored on the same held-out
    samples (shaped as `training.model_kinds.KindCandidate`, with what it publishes)."""

    model: Any  # ContinuationMLP
    metadata: Any  # ArtifactMetadata
    metrics: dict[str, Any]
    evaluation_samples: int
    current_metrics: dict[str, Any] | None = None
    current_problem: str | None = None  # why the current model could not be scored
    data: dict[str, Any] = field(default_factory=dict)  # trace files: for the report
    handoff: SplitHandoff | None = None  # trace files: the split, for the followers


class LogTrainer(Protocol):
    """Trains on trace files (the caller knows their formats; training does not).

    `handles` says whether the selected files are its kind (raising a `UserError` for a
    folder it cannot take, e.g. a mix of kinds); `train` raises a `UserError` for a file it
    cannot read, naming the file and line."""

    def handles(self, paths: list[Path]) -> bool: ...
    def train(self, paths: list[Path], current: Path | None) -> AccessCandidate: ...


class BadLogsError(Exception):
    """The selected log files cannot be trained on (a `UserError` while reading them)."""


@dataclass(frozen=True)
class RetrainConfig:
    logs_dir: Path
    registry_dir: Path
    cache_dir: Path
    window_days: float = 28.0
    data_format: str | None = None
    mode: str | None = None
    metric: str = "roc_auc"
    tolerance: float = 0.005
    min_evaluation_samples: int = DEFAULT_MIN_EVALUATION_SAMPLES  # for every model kind
    keep_versions: int = DEFAULT_KEEP_VERSIONS  # in every registry
    force: bool = False
    notify_url: str | None = None
    notify_token: str | None = field(default=None, repr=False)
    train: TrainConfig = field(default_factory=TrainConfig)
    embed: EmbedOptions = field(default_factory=EmbedOptions)
    return_model: ReturnRetrainConfig | None = None  # None: no return-time half

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return InvalidInputError(f"RetrainConfig.{name} {why}, got {getattr(self, name)!r}")

        if not self.window_days > 0:
            raise bad("window_days", "must be > 0")
        if self.metric not in METRICS:
            raise bad("metric", f"must be one of {METRICS}")
        if not 0 <= self.tolerance < 1:
            raise bad("tolerance", "must be in [0, 1)")
        if not isinstance(self.min_evaluation_samples, int) or self.min_evaluation_samples < 1:
            raise bad("min_evaluation_samples", "must be a positive integer")
        if not isinstance(self.keep_versions, int) or self.keep_versions < 1:
            raise bad("keep_versions", "must be a positive integer")
        if self.notify_url is not None:  # parsed now, not tried after hours of training
            try:
                check_predictor_url(self.notify_url)
            except ValueError as error:
                raise InvalidInputError(f"RetrainConfig.notify_url {error}") from None


@dataclass
class RetrainOutcome:
    status: str
    reason: str
    version: str | None = None
    current_version: str | None = None
    candidate_metrics: dict[str, Any] | None = None
    current_metrics: dict[str, Any] | None = None
    data: dict[str, Any] = field(default_factory=dict)
    notified: bool | None = None
    seconds: float = 0.0
    # the follower kinds' sections (`return_model`); empty: the run trained nothing
    sections: dict[str, KindOutcome] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def return_model(self) -> KindOutcome | None:
        return self.sections.get("return_model")

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "version": self.version,
            "current_version": self.current_version,
            "candidate_metrics": self.candidate_metrics,
            "current_metrics": self.current_metrics,
            "data": self.data,
            "notified": self.notified,
            "seconds": round(self.seconds, 3),
            "return_model": None,
            **{section: outcome.to_dict() for section, outcome in self.sections.items()},
        }


def load_logged_conversations(
    files: list[LogFile], data_format: str | None, mode: str | None
) -> tuple[list[Conversation], dict[str, Any]]:
    """Conversations of the selected files; a conversation in several files: newest wins."""
    from training.loaders import load_conversations

    by_id: dict[str, Conversation] = {}
    reports = {}
    for log in files:  # oldest first, so a later file's copy replaces an earlier one
        options = {} if mode is None else {"mode": mode}
        result = load_conversations(log.path, format=data_format, **options)
        for conversation in result.conversations:
            by_id.pop(conversation.conversation_id, None)
            by_id[conversation.conversation_id] = conversation
        reports[log.relative] = result.report.conversations_produced
    return list(by_id.values()), {"conversations_per_file": reports, "conversations": len(by_id)}


def notify_server(url: str, artifact: Path, token: str | None, timeout_s: float = 60.0) -> str:
    """Ask a running `lpc serve` to reload `artifact`; returns its answer (raises on error)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.post(
        url.rstrip("/") + "/v1/reload",
        json={"artifact": str(artifact)},
        headers=headers,
        timeout=timeout_s,
    )
    if response.status_code != 200:
        raise RuntimeError(f"reload answered {response.status_code}: {response.text[:300]}")
    return response.text


def run_retrain(
    config: RetrainConfig,
    load_embedder: EmbedderLoader,
    log: Log = print,
    now: datetime | None = None,
    token_counter: TokenCounter | None = None,
    log_trainer: LogTrainer | None = None,
    return_trainer: ReturnTrainer = train_return_candidate,
    followers: list[FollowerKind] | None = None,
) -> RetrainOutcome:
    """One daily run (docs/design.md, "The daily job"). Never raises for expected failures: the
    outcome's status says what happened. `token_counter`: for token finish features;
    log_trainer: trains on trace files when the selected files are ones; followers: the
    model kinds retrained after the access or text model (default: the return-time model,
    `config.return_model`, fitted by `return_trainer`)."""
    started = time.perf_counter()
    if followers is None:
        followers = [
            ReturnModelKind(
                config.return_model,
                return_trainer,
                config.min_evaluation_samples,
                config.keep_versions,
            )
        ]
    registry = ModelRegistry(config.registry_dir)
    try:
        with registry.lock():
            try:
                outcome = _run_locked(
                    config,
                    registry,
                    load_embedder,
                    log,
                    now or datetime.now(UTC),
                    token_counter,
                    log_trainer,
                    followers,
                )
            except BadLogsError as error:  # recorded; the files are left for a fixed rerun
                outcome = RetrainOutcome(
                    BAD_INPUT, str(error), current_version=registry.current_version()
                )
                registry.append_history(
                    {"event": "retrain", "status": BAD_INPUT, "reason": outcome.reason}
                )
            except Exception as error:  # recorded, reported as a failed run
                outcome = RetrainOutcome(
                    FAILED,
                    f"{type(error).__name__}: {error}",
                    current_version=registry.current_version(),
                )
                registry.append_history(
                    {"event": "retrain", "status": FAILED, "reason": outcome.reason}
                )
    except RegistryLockedError as error:
        outcome = RetrainOutcome(LOCKED, str(error))
    outcome.seconds = time.perf_counter() - started
    return outcome


@dataclass
class _SelectedLogs:
    """What the run found in the logs folder and chose to train on.

    `found` is every log file (saved as seen once a version is published, so the next run's
    "new" starts after them); `data` describes the selection and gathers what training adds,
    for the report and the history; `current_version` is the model the candidate challenges.
    """

    found: list[LogFile]
    selection: LogSelection
    data: dict[str, Any]
    current_version: str | None


@dataclass
class AccessModelKind:
    """The access or text model as the daily job's first model kind
    (`training.model_kinds.ModelKind`): trained on the selected logs (trace files through
    the log trainer, conversations through `train_predictor`), judged on `config.metric`,
    published to the job's registry. Its decision is the run's exit status."""

    config: RetrainConfig
    registry: ModelRegistry
    logs: _SelectedLogs
    load_embedder: EmbedderLoader
    token_counter: TokenCounter | None
    log_trainer: LogTrainer | None
    log: Log
    label: str = "registry"

    @property
    def metric(self) -> str:
        return self.config.metric

    @property
    def tolerance(self) -> float:
        return self.config.tolerance

    @property
    def keep_versions(self) -> int:
        return self.config.keep_versions

    def train(self, handoff: None, log: Log) -> AccessCandidate:
        """The first kind trains on the selected logs; nothing is handed to it."""
        return _train_candidate(
            self.config,
            self.registry,
            self.logs,
            self.load_embedder,
            log,
            self.token_counter,
            self.log_trainer,
        )

    def decide(self, candidate: AccessCandidate) -> Decision:
        """Promote or keep (`decide`, on the configured metric and tolerance), logged."""
        config = self.config
        decision = decide(
            candidate.metrics,
            candidate.current_metrics,
            config.metric,
            config.tolerance,
            candidate.evaluation_samples,
            config.min_evaluation_samples,
            candidate.current_problem,
        )
        verdict = "promote" if decision.promote else "keep current"
        self.log(f"decision: {verdict}: {decision.reason}")
        return decision

    def publish(self, candidate: AccessCandidate, registry_notes: dict[str, Any]) -> str:
        return self.registry.publish(candidate.model, candidate.metadata, registry_notes)

    def history_extra(self) -> dict[str, Any]:
        return {"new_files": self.logs.data["new_files"], "files": len(self.logs.selection.files)}


def _run_locked(
    config: RetrainConfig,
    registry: ModelRegistry,
    load_embedder: EmbedderLoader,
    log: Log,
    now: datetime,
    token_counter: TokenCounter | None,
    log_trainer: LogTrainer | None,
    followers: list[FollowerKind],
) -> RetrainOutcome:
    """The run's stages, in order (docs/design.md, "The daily job"). A `BadLogsError` or any other
    exception of the first kind propagates to `run_retrain`, which records it. Each follower
    kind runs once the first kind is recorded and reported, and never raises."""
    logs = _pick_logs(config, registry, now, log)
    nothing_to_do = _nothing_to_learn(config, logs)
    if nothing_to_do is not None:
        return nothing_to_do
    first = AccessModelKind(config, registry, logs, load_embedder, token_counter, log_trainer, log)
    candidate = first.train(None, log)
    decision, version = publish_and_record(first, candidate, logs.current_version, log)
    result = _report(config, registry, logs, candidate, decision, version, log)
    decided = []
    for kind in followers:
        try:  # it reports its own failures; this guard keeps the first result whatever happens
            outcome = run_follower(kind, candidate.handoff, log)
        except Exception as error:
            outcome = KindOutcome(FOLLOWER_FAILED, f"{type(error).__name__}: {error}", kind.metric)
        result.sections[kind.section] = outcome
        decided.append((kind, outcome))
    _consume_files(registry, logs, version, result, decided, log)
    return result


def _consume_files(
    registry: ModelRegistry,
    logs: _SelectedLogs,
    version: str,
    result: RetrainOutcome,
    followers: list[tuple[FollowerKind, KindOutcome]],
    log: Log,
) -> None:
    """Record every file found as trained on (the next run's "new" starts after them), but
    only once every model that reads them has decided on them: the first kind always has
    by now; a follower has unless it failed or was locked out. Until then the files stay
    new, so a follower that failed, or a run killed during it, is trained again by the next
    run rather than lost to a "no new log files" exit."""
    undecided = [(kind, outcome) for kind, outcome in followers if not outcome.files_decided]
    result.data["files_recorded_as_trained"] = not undecided
    if undecided:
        for kind, outcome in undecided:
            log(
                f"logs: not recorded as trained on: {kind.describe} {outcome.decision}; "
                "the next run takes these files again"
            )
        return
    registry.save_state(
        {
            "last_run_at": now_iso(),
            "seen_files": sorted(f.identity for f in logs.found),
            "last_version": version,
        }
    )


def _pick_logs(
    config: RetrainConfig, registry: ModelRegistry, now: datetime, log: Log
) -> _SelectedLogs:
    """Clear what a killed run left in the registry, then pick the files to train on: the new
    ones since the last run plus the window of older ones (`training.log_files`)."""
    clean_leftovers(registry, "registry", log)
    state = registry.state()
    found = discover_logs(config.logs_dir)
    selection = select_logs(found, state.get("seen_files", []), now, config.window_days)
    return _SelectedLogs(found, selection, selection.describe(), registry.current_version())


def _nothing_to_learn(config: RetrainConfig, logs: _SelectedLogs) -> RetrainOutcome | None:
    """The `no_new_data` outcome when there is nothing to train on (no new file and no
    `force`, or no file in the window); None when the run goes on."""
    selection = logs.selection
    if not selection.new_files and not config.force:
        return RetrainOutcome(
            NO_NEW_DATA,
            f"no new log files in {config.logs_dir} since the "
            "last run (pass --force to retrain anyway)",
            None,
            logs.current_version,
            data=logs.data,
        )
    if not selection.files:
        return RetrainOutcome(
            NO_NEW_DATA,
            f"no log files in {config.logs_dir} dated within the last {config.window_days:g} days",
            None,
            logs.current_version,
            data=logs.data,
        )
    return None


def _train_candidate(
    config: RetrainConfig,
    registry: ModelRegistry,
    logs: _SelectedLogs,
    load_embedder: EmbedderLoader,
    log: Log,
    token_counter: TokenCounter | None,
    log_trainer: LogTrainer | None,
) -> AccessCandidate:
    """Train a candidate on the selected files and score the current model beside it: trace
    files through the caller's log trainer, conversations through `train_predictor`. Files
    that cannot be read are bad input (`BadLogsError`), not a failed run."""
    selection = logs.selection
    log(
        f"logs: {len(selection.files)} files ({len(selection.new_files)} new) since "
        f"{selection.window_start:%Y-%m-%d}"
    )
    paths = [f.path for f in selection.files]
    try:
        traces = log_trainer is not None and log_trainer.handles(paths)
    except UserError as error:
        raise BadLogsError(str(error)) from None
    if traces:
        return _train_on_traces(log_trainer, paths, registry, logs, log)
    return _train_on_conversations(config, registry, logs, load_embedder, log, token_counter)


def _train_on_traces(
    log_trainer: LogTrainer,
    paths: list[Path],
    registry: ModelRegistry,
    logs: _SelectedLogs,
    log: Log,
) -> AccessCandidate:
    """An access-only candidate from request traces (no text); the trainer scores the current
    model too, on the later part of the same traces."""
    log("logs are trace files: training an access-only model (no text)")
    try:
        candidate = log_trainer.train(paths, registry.current_path())
    except UserError as error:  # a file that cannot be read, a split or horizon too long
        raise BadLogsError(str(error)) from None
    logs.data.update(candidate.data)
    return candidate


def _train_on_conversations(
    config: RetrainConfig,
    registry: ModelRegistry,
    logs: _SelectedLogs,
    load_embedder: EmbedderLoader,
    log: Log,
    token_counter: TokenCounter | None,
) -> AccessCandidate:
    """A candidate trained on the training half of the logged conversations, and the current
    model scored on the candidate's evaluation half (the same samples, so the two compare)."""
    conversations = _load_conversations(config, logs)
    embedder = load_embedder(config.train.embedder_spec)
    cache = EmbeddingCache.open(
        config.cache_dir, embedder.embedder_id, embedder.dim, embedder=embedder
    )
    outcome = train_predictor(
        conversations,
        config.train,
        embedder,
        cache,
        config.embed,
        data_description={"logs": str(config.logs_dir), **logs.data},
        log=log,
        token_counter=token_counter,
    )
    candidate = AccessCandidate(
        outcome.artifact.model,
        outcome.artifact.metadata,
        outcome.metrics.get("evaluation", {}),
        outcome.metrics["data"]["evaluation_samples"],
    )

    current_path = registry.current_path()
    if current_path is not None and candidate.evaluation_samples:
        try:
            candidate.current_metrics = _score_current(
                current_path,
                outcome.split.evaluation,
                embedder,
                cache,
                config,
                load_embedder,
                conversations,
                token_counter,
            )
        except (ArtifactError, OSError, ValueError) as error:
            candidate.current_problem = f"{type(error).__name__}: {error}"
    return candidate


def _load_conversations(config: RetrainConfig, logs: _SelectedLogs) -> list[Conversation]:
    """The conversations of the selected files; what was loaded goes into the report."""
    try:
        conversations, loaded = load_logged_conversations(
            logs.selection.files, config.data_format, config.mode
        )
    except UserError as error:  # a loader names the file and what is wrong in it
        raise BadLogsError(str(error)) from None
    logs.data.update(loaded)
    return conversations


def _report(
    config: RetrainConfig,
    registry: ModelRegistry,
    logs: _SelectedLogs,
    candidate: AccessCandidate,
    decision: Decision,
    version: str,
    log: Log,
) -> RetrainOutcome:
    """The run's outcome; after a promotion, a running `lpc serve` is told to reload. A failed
    reload is only a warning: the promotion stands and the server keeps its model."""
    result = RetrainOutcome(
        PROMOTED if decision.promote else KEPT,
        decision.reason,
        version,
        registry.current_version(),
        candidate.metrics,
        candidate.current_metrics,
        logs.data,
    )
    if decision.promote and config.notify_url:
        try:
            notify_server(config.notify_url, registry.current_link, config.notify_token)
            result.notified = True
            log(f"notified {config.notify_url}: reloaded {registry.current_link}")
        except Exception as error:  # the promotion stands; the server keeps its model
            result.notified = False
            log(f"warning: could not notify {config.notify_url}: {error}")
    return result


def _score_current(
    path: Path,
    holdout,
    embedder: Embedder,
    cache: EmbeddingCache,
    config: RetrainConfig,
    load_embedder: EmbedderLoader,
    conversations: list[Conversation],
    token_counter: TokenCounter | None,
) -> dict[str, Any]:
    """The current model's metrics on the candidate's held-out samples (its own embedder's
    cache when it was trained on another embedder; token counts when it needs them)."""
    from predictor.access_features import needs_token_counts
    from predictor.artifact import load_artifact
    from training.samples import with_token_counts

    metadata = load_artifact(path).metadata
    needs_tokens = needs_token_counts(metadata.mlp_config.extra_features)
    if needs_tokens and holdout and holdout[0].request_tokens is None:
        if token_counter is None:
            raise ValueError(
                "the current model needs serving token counts and no token counter was given"
            )
        holdout, _ = with_token_counts(holdout, token_counter(conversations))
    if metadata.embedder_id != embedder.embedder_id:
        embedder = load_embedder(metadata.embedder_spec)
        cache = EmbeddingCache.open(
            config.cache_dir, embedder.embedder_id, embedder.dim, embedder=embedder
        )
    return evaluate_artifact(path, holdout, cache, config.embed, embedder)
