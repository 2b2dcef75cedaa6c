"""The daily job's model kinds: the one protocol every retrained model implements.

`lpc retrain` (`training.retrain.run_retrain`) retrains a list of models from the same logs.
Each is a `ModelKind` plug-in with its own registry: it trains a candidate and scores its
current model beside it (`train`), decides (`decide`), and writes a version (`publish`).
What follows a decision is the same for every kind, so it lives here once
(`publish_and_record`). The first kind is the run's; every later kind is a follower
(`run_follower`) that never raises.

Leader and followers: docs/design.md, "The daily job".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from training.model_registry import ModelRegistry, RegistryLockedError
from training.promotion import Decision

PROMOTED, KEPT, SKIPPED, FAILED, LOCKED = "promoted", "kept", "skipped", "failed", "locked"
# The job's promotion settings shared by every kind (`lpc retrain --min-eval-samples`,
# `--keep-versions`): one value for every registry.
DEFAULT_MIN_EVALUATION_SAMPLES = 200
DEFAULT_KEEP_VERSIONS = 20

Log = Callable[[str], None]


@dataclass
class KindCandidate:
    """A kind's trained candidate, and its current model scored on the same samples."""

    metrics: dict[str, Any]
    evaluation_samples: int
    current_metrics: dict[str, Any] | None = None
    current_problem: str | None = None  # why the current model could not be scored


class ModelKind(Protocol):
    """One model the daily job retrains (a plug-in of `training.retrain.run_retrain`).

    `label` prefixes its registry's log lines ("registry", "return registry"); `metric`,
    `tolerance` and `keep_versions` are its promotion settings, recorded with each version.
    """

    registry: ModelRegistry
    label: str
    metric: str
    tolerance: float
    keep_versions: int

    def train(self, handoff: Any, log: Log) -> Any:
        """A candidate (a `KindCandidate`) with the current model scored beside it; `handoff`
        is what the run's first kind handed on (None for the first kind itself)."""
        ...

    def decide(self, candidate: Any) -> Decision: ...

    def publish(self, candidate: Any, registry_notes: dict[str, Any]) -> str: ...

    def history_extra(self) -> dict[str, Any]: ...


class FollowerKind(ModelKind, Protocol):
    """A kind trained on what the run's first kind handed on (`handoff`: its split).

    `section` names its part of the outcome; `name` prefixes its log lines ("return
    model"); `describe` names it in prose ("the return-time model"); `skip_reason` says why
    it does not run this time (None: it runs)."""

    section: str
    name: str
    describe: str

    def skip_reason(self, handoff: Any) -> str | None: ...

    def outcome_fit(self, candidate: Any) -> dict[str, Any] | None: ...


@dataclass
class KindOutcome:
    """A follower's section of the daily job's outcome (`return_model`)."""

    decision: str  # promoted, kept, skipped, failed, locked
    reason: str
    metric: str
    version: str | None = None
    current_version: str | None = None
    candidate_metrics: dict[str, Any] | None = None
    current_metrics: dict[str, Any] | None = None
    registry: str | None = None
    fit: dict[str, Any] | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 3)}

    @property
    def files_decided(self) -> bool:
        """Whether this kind has decided on the run's files (not failed, not locked out)."""
        return self.decision not in (FAILED, LOCKED)


def clean_leftovers(registry: ModelRegistry, label: str, log: Log) -> None:
    """Remove the staging folders a killed run left in `registry` (under its lock)."""
    removed = registry.clean_staging()
    if removed:
        log(f"{label}: removed leftovers of an interrupted run: {', '.join(removed)}")


def publish_and_record(
    kind: ModelKind, candidate: KindCandidate, compared_with: str | None, log: Log
) -> tuple[Decision, str]:
    """Decide, publish the candidate as a new version whichever the decision (it records the
    decision and why, so a kept candidate can still be inspected), make it current when
    promoted, append a history line and prune old versions. Returns the decision and the
    version."""
    decision = kind.decide(candidate)
    status = PROMOTED if decision.promote else KEPT
    version = kind.publish(
        candidate,
        {
            "decision": status,
            "reason": decision.reason,
            "metric": kind.metric,
            "tolerance": kind.tolerance,
            "compared_with": compared_with,
            "current_metrics": candidate.current_metrics,
        },
    )
    if decision.promote:
        kind.registry.promote(version)
    kind.registry.append_history(
        {
            "event": "retrain",
            "status": status,
            "version": version,
            "reason": decision.reason,
            "compared_with": compared_with,
            "candidate_metrics": candidate.metrics,
            "current_metrics": candidate.current_metrics,
            **kind.history_extra(),
        }
    )
    pruned = kind.registry.prune(kind.keep_versions)
    if pruned:
        log(f"{kind.label}: pruned {', '.join(pruned)}")
    return decision, version


def run_follower(kind: FollowerKind, handoff: Any, log: Log) -> KindOutcome:
    """A follower kind's whole turn: skipped (saying why), or trained, judged, published and
    promoted under its registry's own lock. Never raises: a failure is the outcome's
    `failed` (with a history line when the registry can take one), and the current model
    stays as it was (writes are the registry's atomic ones)."""
    skip = kind.skip_reason(handoff)
    if skip is not None:
        return KindOutcome(SKIPPED, skip, kind.metric)
    started = time.perf_counter()
    registry = kind.registry
    try:
        with registry.lock():
            try:
                outcome = _train_and_publish(kind, handoff, log)
            except Exception as error:  # reported; the first kind's result is already recorded
                outcome = KindOutcome(
                    FAILED,
                    f"{type(error).__name__}: {error}",
                    kind.metric,
                    current_version=registry.current_version(),
                    registry=str(registry.root),
                )
                # the outcome says what failed; a history that cannot be written loses nothing
                with contextlib.suppress(Exception):
                    registry.append_history(
                        {"event": "retrain", "status": FAILED, "reason": outcome.reason}
                    )
    except RegistryLockedError as error:
        outcome = KindOutcome(LOCKED, str(error), kind.metric, registry=str(registry.root))
    except Exception as error:  # e.g. a registry folder that cannot be created
        outcome = KindOutcome(
            FAILED, f"{type(error).__name__}: {error}", kind.metric, registry=str(registry.root)
        )
    outcome.seconds = time.perf_counter() - started
    log(f"{kind.name}: {outcome.decision}: {outcome.reason}")
    return outcome


def _train_and_publish(kind: FollowerKind, handoff: Any, log: Log) -> KindOutcome:
    clean_leftovers(kind.registry, kind.label, log)
    compared_with = kind.registry.current_version()
    candidate = kind.train(handoff, log)
    decision, version = publish_and_record(kind, candidate, compared_with, log)
    return KindOutcome(
        PROMOTED if decision.promote else KEPT,
        decision.reason,
        kind.metric,
        version,
        kind.registry.current_version(),
        candidate.metrics,
        candidate.current_metrics,
        str(kind.registry.root),
        kind.outcome_fit(candidate),
    )
