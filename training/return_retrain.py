"""The daily job's return-time half: retrain the hazard model, judge it, promote or keep.

When `lpc retrain` trains on trace files, the access candidate's split is handed on here
(`ReturnContext`: the same request table, features, cut and validation share), so the
return-time candidate learns from exactly the access candidate's training part and is
scored on the same evaluation part. Its own choices (grid, architecture, epochs, ensemble)
follow `training.return_fit`'s validation rule, unchanged.

Judgement: the candidate and the return registry's current model are scored on the same
evaluation releases (`training.return_quality.curve_quality`, IPCW with the censoring
distribution of the training part, as `lpc train-return`). The integrated Brier score (5 to
600 s) decides — lower is better, and it judges the whole curve an evictor reads, not one
horizon — with a `tolerance`: the candidate is promoted unless its IBS is higher than the
current one's by more than that. Concordance is reported beside it. No current model, or one
that does not load or that these requests cannot feed: promote, saying why.

The return registry is a `ModelRegistry` of its own (versions, `current`, history, lock,
atomic writes), checked with the return model's loader. This half runs after the access
half is recorded and never raises: a failure is reported in its outcome (`failed`) and can
neither change the access model's result nor the current return model.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from predictor.errors import InvalidInputError, UserError
from predictor.json_values import finite_or_none
from predictor.return_time import ReturnModelMetadata, ReturnTimePredictor, save_return_model
from training.model_registry import ModelRegistry, RegistryLockedError, registry_record
from training.promotion import Decision, decide
from training.return_data import ReturnPart, return_samples
from training.return_fit import ReturnFitConfig, fit_return_model
from training.return_quality import curve_quality
from training.survival_metrics import StepSurvival, censoring_survival

PROMOTED, KEPT, SKIPPED, FAILED, LOCKED = "promoted", "kept", "skipped", "failed", "locked"
METRIC = "integrated_brier"
# IBS units; the hazard model beats Kaplan-Meier per turn by 0.008 on Mooncake (split 0.5),
# so a quarter of that edge is noise to tolerate, not a loss to accept.
DEFAULT_RETURN_TOLERANCE = 0.002

Log = Callable[[str], None]


@dataclass(frozen=True)
class ReturnRetrainConfig:
    """Settings of the return half (`lpc retrain --return-*`)."""

    registry_dir: Path
    tolerance: float = DEFAULT_RETURN_TOLERANCE
    min_evaluation_samples: int = 200
    keep_versions: int = 20
    fit: ReturnFitConfig = field(default_factory=ReturnFitConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance < 1:
            raise InvalidInputError(
                f"ReturnRetrainConfig.tolerance must be in [0, 1), got {self.tolerance!r}"
            )
        for name in ("min_evaluation_samples", "keep_versions"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidInputError(
                    f"ReturnRetrainConfig.{name} must be a positive integer, got {value!r}"
                )


@dataclass(frozen=True)
class ReturnContext:
    """The access candidate's split, handed to the return half: same rows, same cut."""

    table: pd.DataFrame  # the request table, sorted by arrival
    feature_names: tuple[str, ...]
    cut_s: float  # the evaluation part starts here
    validation_fraction: float
    notes: dict[str, Any] = field(default_factory=dict)  # trace, split rule: for the artifact


@dataclass
class ReturnCandidate:
    """A fitted return-time model, and the current one scored beside it."""

    metadata: ReturnModelMetadata
    weights: list[np.ndarray]
    biases: list[np.ndarray]
    metrics: dict[str, Any]
    evaluation_samples: int
    current_metrics: dict[str, Any] | None = None
    current_problem: str | None = None  # why the current model could not be scored
    fit: dict[str, Any] = field(default_factory=dict)


ReturnTrainer = Callable[[ReturnContext, Path | None, ReturnFitConfig], ReturnCandidate]


@dataclass
class ReturnModelOutcome:
    """The `return_model` section of the daily job's outcome."""

    decision: str  # promoted, kept, skipped, failed, locked
    reason: str
    version: str | None = None
    current_version: str | None = None
    candidate_metrics: dict[str, Any] | None = None
    current_metrics: dict[str, Any] | None = None
    registry: str | None = None
    fit: dict[str, Any] | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "reason": self.reason,
            "metric": METRIC,
            "version": self.version,
            "current_version": self.current_version,
            "candidate_metrics": self.candidate_metrics,
            "current_metrics": self.current_metrics,
            "registry": self.registry,
            "fit": self.fit,
            "seconds": round(self.seconds, 3),
        }


def decide_return(
    candidate: dict[str, Any],
    current: dict[str, Any] | None,
    tolerance: float,
    evaluation_samples: int,
    min_samples: int,
    current_problem: str | None = None,
) -> Decision:
    """Promote unless the candidate's IBS is higher (worse) than the current model's by more
    than `tolerance`; C is quoted beside it (`training.promotion.decide`)."""
    return decide(
        candidate,
        current,
        METRIC,
        tolerance,
        evaluation_samples,
        min_samples,
        current_problem,
        lower_is_better=True,
        label="IBS",
        model="return model",
        samples="evaluation releases",
        undefined_because="",
        note="" if current is None else f"C {_c(candidate)} vs {_c(current)}",
    )


def _c(metrics: dict[str, Any]) -> str:
    value = metrics.get("concordance")
    return "—" if value is None else f"{value:.4f}"


def _quality(
    part: ReturnPart, grid_s: np.ndarray, survival: np.ndarray, censoring: StepSurvival
) -> dict[str, Any]:
    """`curve_quality` on a part, with its size; an undefined figure (NaN: e.g. no release
    observed long enough for the AUC at 600 s) becomes None, so the outcome and the history
    stay valid JSON."""
    quality = curve_quality(part.targets.time_s, part.targets.observed, grid_s, survival, censoring)
    return {**finite_or_none(quality), "samples": part.size}


def train_return_candidate(
    context: ReturnContext, current: Path | None, fit: ReturnFitConfig
) -> ReturnCandidate:
    """Fit on the context's training part (`fit_return_model`'s own validation rule), score
    the candidate and the current model on its evaluation part."""
    names = context.feature_names
    samples = return_samples(context.table, names, context.cut_s, context.validation_fraction)
    training, evaluation = samples.parts["training"], samples.parts["evaluation"]
    result = fit_return_model(samples, fit)
    predictor = ReturnTimePredictor(result.metadata(names), result.weights, result.biases)
    censoring = censoring_survival(training.targets.time_s, training.targets.observed)
    metrics: dict[str, Any] = {"samples": 0}
    if evaluation.size:
        metrics = _quality(
            evaluation, result.grid_s, predictor.survival(evaluation.features), censoring
        )
    fingerprint = hashlib.sha256(
        f"{len(context.table)}:{context.cut_s}:{','.join(names)}".encode()
    ).hexdigest()[:16]
    metadata = result.metadata(
        names,
        metrics={"evaluation": metrics, "candidates": result.candidates},
        notes={
            **context.notes,
            "validation_fraction": context.validation_fraction,
            "training_data_fingerprint": fingerprint,
            "epochs": result.epochs,
            "samples": {p: samples.parts[p].counts() for p in samples.parts},
        },
    )
    candidate = ReturnCandidate(
        metadata,
        result.weights,
        result.biases,
        metrics,
        evaluation.size,
        fit={
            "grid_points": len(result.grid_s) - 1,
            "grid_last_s": float(result.grid_s[-1]),
            "hidden_sizes": list(result.hidden),
            "epochs": result.epochs,
            "members": result.members,
            "recipe": result.recipe,
            "fit_s": round(result.fit_seconds, 3),
        },
    )
    if current is not None and evaluation.size:
        candidate.current_metrics, candidate.current_problem = score_current_return(
            current, context.table, evaluation, censoring
        )
    return candidate


def score_current_return(
    path: Path, table: pd.DataFrame, evaluation: ReturnPart, censoring: StepSurvival
) -> tuple[dict[str, Any] | None, str | None]:
    """The current return model's quality on the candidate's evaluation releases, or why it
    has none (it does not load, is not a return-time model, or reads a feature these
    requests lack)."""
    try:
        current = ReturnTimePredictor.load(path)
        survival = current.survival_table(table.reset_index(drop=True))[evaluation.rows]
    except (UserError, OSError, ValueError, KeyError) as error:
        return None, f"{type(error).__name__}: {error}"
    return _quality(evaluation, current.grid_s, survival, censoring), None


def run_return_half(
    config: ReturnRetrainConfig,
    context: ReturnContext,
    log: Log,
    trainer: ReturnTrainer = train_return_candidate,
) -> ReturnModelOutcome:
    """Train, judge, publish (every candidate, as the access registry does) and promote, under
    the return registry's own lock. Never raises: a failure is the outcome's `failed`, and
    the current return model stays as it was (writes are the registry's atomic ones)."""
    started = time.perf_counter()
    registry = ModelRegistry(config.registry_dir, check=ReturnTimePredictor.load)
    try:
        with registry.lock():
            try:
                outcome = _judge_and_publish(config, context, registry, log, trainer)
            except Exception as error:  # reported; the access result is already recorded
                outcome = ReturnModelOutcome(
                    FAILED,
                    f"{type(error).__name__}: {error}",
                    current_version=registry.current_version(),
                    registry=str(registry.root),
                )
                _try_history(
                    registry, {"event": "retrain", "status": FAILED, "reason": outcome.reason}
                )
    except RegistryLockedError as error:
        outcome = ReturnModelOutcome(LOCKED, str(error), registry=str(registry.root))
    except Exception as error:  # e.g. a registry folder that cannot be created
        outcome = ReturnModelOutcome(
            FAILED, f"{type(error).__name__}: {error}", registry=str(registry.root)
        )
    outcome.seconds = time.perf_counter() - started
    log(f"return model: {outcome.decision}: {outcome.reason}")
    return outcome


def _try_history(registry: ModelRegistry, entry: dict[str, Any]) -> None:
    # the outcome already says what failed; a history that cannot be written loses nothing more
    with contextlib.suppress(Exception):
        registry.append_history(entry)


def _judge_and_publish(
    config: ReturnRetrainConfig,
    context: ReturnContext,
    registry: ModelRegistry,
    log: Log,
    trainer: ReturnTrainer,
) -> ReturnModelOutcome:
    removed = registry.clean_staging()
    if removed:
        log(f"return registry: removed leftovers of an interrupted run: {', '.join(removed)}")
    compared_with = registry.current_version()
    log("return model: training the return-time candidate on the same split")
    candidate = trainer(context, registry.current_path(), config.fit)
    verdict = decide_return(
        candidate.metrics,
        candidate.current_metrics,
        config.tolerance,
        candidate.evaluation_samples,
        config.min_evaluation_samples,
        candidate.current_problem,
    )
    decision = PROMOTED if verdict.promote else KEPT
    notes = {
        **candidate.metadata.notes,
        "registry": registry_record(
            {
                "decision": decision,
                "reason": verdict.reason,
                "metric": METRIC,
                "tolerance": config.tolerance,
                "compared_with": compared_with,
                "current_metrics": candidate.current_metrics,
            }
        ),
    }
    metadata = replace(candidate.metadata, notes=notes)
    version = registry.publish_folder(
        lambda folder: save_return_model(folder, metadata, candidate.weights, candidate.biases)
    )
    if verdict.promote:
        registry.promote(version)
    registry.append_history(
        {
            "event": "retrain",
            "status": decision,
            "version": version,
            "reason": verdict.reason,
            "compared_with": compared_with,
            "candidate_metrics": candidate.metrics,
            "current_metrics": candidate.current_metrics,
        }
    )
    pruned = registry.prune(config.keep_versions)
    if pruned:
        log(f"return registry: pruned {', '.join(pruned)}")
    return ReturnModelOutcome(
        decision,
        verdict.reason,
        version,
        registry.current_version(),
        candidate.metrics,
        candidate.current_metrics,
        str(registry.root),
        candidate.fit,
    )


def retrain_return_model(
    config: ReturnRetrainConfig | None,
    context: ReturnContext | None,
    log: Log,
    trainer: ReturnTrainer = train_return_candidate,
) -> ReturnModelOutcome:
    """The daily job's return half (`run_return_half`), or why it is skipped: not asked for
    (`config` None), or no split to train on (conversation logs: no request times)."""
    if config is None:
        return ReturnModelOutcome(SKIPPED, "not asked for (--no-return-model)")
    if context is None:
        return ReturnModelOutcome(
            SKIPPED,
            "the logs are conversation text: a return time needs request arrival times "
            "(trace files)",
        )
    return run_return_half(config, context, log, trainer)
