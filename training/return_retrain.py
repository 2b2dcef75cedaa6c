"""The daily job's return-time model kind: retrain the hazard model, judge it, promote or keep.

It trains on the access candidate's split (`SplitHandoff`), follows `training.return_fit`'s
validation rule, and promotes the candidate unless its integrated Brier score is higher than
the current model's by more than `tolerance`. `ReturnModelKind` is the plug-in
(`training.model_kinds`), run as a follower that never raises; its registry is a
`ModelRegistry` of its own.

The judgement and the follower's rules: docs/design.md, "The daily job".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from predictor.errors import InvalidInputError, UserError
from predictor.json_values import finite_or_none
from predictor.return_time import ReturnModelMetadata, ReturnTimePredictor, save_return_model
from training.model_kinds import (
    DEFAULT_KEEP_VERSIONS,
    DEFAULT_MIN_EVALUATION_SAMPLES,
    KindOutcome,
    run_follower,
)
from training.model_kinds import FAILED as FAILED  # the decisions, re-exported
from training.model_kinds import KEPT as KEPT
from training.model_kinds import LOCKED as LOCKED
from training.model_kinds import PROMOTED as PROMOTED
from training.model_kinds import SKIPPED as SKIPPED
from training.model_registry import ModelRegistry, registry_record
from training.promotion import Decision, decide
from training.return_data import ReturnPart, return_samples
from training.return_fit import ReturnFitConfig, fit_return_model
from training.return_quality import curve_quality
from training.survival_metrics import StepSurvival, censoring_survival

METRIC = "integrated_brier"
# IBS units; the hazard model beats Kaplan-Meier per turn by 0.008 on Mooncake (split 0.5),
# so a quarter of that edge is noise to tolerate, not a loss to accept.
DEFAULT_RETURN_TOLERANCE = 0.002

Log = Callable[[str], None]


@dataclass(frozen=True)
class ReturnRetrainConfig:
    """Settings of the return half of its own (`lpc retrain --return-*`); the evaluation
    minimum and the versions kept are the job's, one value for both registries
    (`RetrainConfig.min_evaluation_samples`, `keep_versions`)."""

    registry_dir: Path
    tolerance: float = DEFAULT_RETURN_TOLERANCE
    fit: ReturnFitConfig = field(default_factory=ReturnFitConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance < 1:
            raise InvalidInputError(
                f"ReturnRetrainConfig.tolerance must be in [0, 1), got {self.tolerance!r}"
            )


@dataclass(frozen=True)
class SplitHandoff:
    """The access candidate's split, handed on to the follower kinds (the return half):
    same rows, same cut. Data the run computed, not settings."""

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


ReturnTrainer = Callable[[SplitHandoff, Path | None, ReturnFitConfig], ReturnCandidate]


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
    split: SplitHandoff, current: Path | None, fit: ReturnFitConfig
) -> ReturnCandidate:
    """Fit on the split's training part (`fit_return_model`'s own validation rule), score
    the candidate and the current model on its evaluation part."""
    names = split.feature_names
    samples = return_samples(split.table, names, split.cut_s, split.validation_fraction)
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
        f"{len(split.table)}:{split.cut_s}:{','.join(names)}".encode()
    ).hexdigest()[:16]
    metadata = result.metadata(
        names,
        metrics={"evaluation": metrics, "candidates": result.candidates},
        notes={
            **split.notes,
            "validation_fraction": split.validation_fraction,
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
            current, split.table, evaluation, censoring
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


@dataclass
class ReturnModelKind:
    """The return-time model as a plug-in of the daily job (`training.model_kinds`): trained
    on the split the access model hands on, judged by the integrated Brier score, published
    to its own registry. `config` None: not asked for (--no-return-model);
    `min_evaluation_samples` and `keep_versions`: the job's (`RetrainConfig`)."""

    config: ReturnRetrainConfig | None
    trainer: ReturnTrainer = train_return_candidate
    min_evaluation_samples: int = DEFAULT_MIN_EVALUATION_SAMPLES
    keep_versions: int = DEFAULT_KEEP_VERSIONS
    section: str = "return_model"
    name: str = "return model"
    describe: str = "the return-time model"
    label: str = "return registry"
    metric: str = METRIC
    _registry: ModelRegistry | None = field(default=None, init=False, repr=False)

    @property
    def registry(self) -> ModelRegistry:
        assert self.config is not None, "a skipped return model has no registry"
        if self._registry is None:
            self._registry = ModelRegistry(self.config.registry_dir, check=ReturnTimePredictor.load)
        return self._registry

    @property
    def tolerance(self) -> float:
        assert self.config is not None
        return self.config.tolerance

    def skip_reason(self, handoff: SplitHandoff | None) -> str | None:
        """Not asked for, or no split to train on (conversation logs: no request times)."""
        if self.config is None:
            return "not asked for (--no-return-model)"
        if handoff is None:
            return (
                "the logs are conversation text: a return time needs request arrival times "
                "(trace files)"
            )
        return None

    def train(self, handoff: SplitHandoff, log: Log) -> ReturnCandidate:
        assert self.config is not None
        log("return model: training the return-time candidate on the same split")
        return self.trainer(handoff, self.registry.current_path(), self.config.fit)

    def decide(self, candidate: ReturnCandidate) -> Decision:
        assert self.config is not None
        return decide_return(
            candidate.metrics,
            candidate.current_metrics,
            self.config.tolerance,
            candidate.evaluation_samples,
            self.min_evaluation_samples,
            candidate.current_problem,
        )

    def publish(self, candidate: ReturnCandidate, registry_notes: dict[str, Any]) -> str:
        notes = {**candidate.metadata.notes, "registry": registry_record(registry_notes)}
        metadata = replace(candidate.metadata, notes=notes)
        return self.registry.publish_folder(
            lambda folder: save_return_model(folder, metadata, candidate.weights, candidate.biases)
        )

    def history_extra(self) -> dict[str, Any]:
        return {}

    def outcome_fit(self, candidate: ReturnCandidate) -> dict[str, Any]:
        return candidate.fit


def retrain_return_model(
    config: ReturnRetrainConfig | None,
    split: SplitHandoff | None,
    log: Log,
    trainer: ReturnTrainer = train_return_candidate,
    min_evaluation_samples: int = DEFAULT_MIN_EVALUATION_SAMPLES,
    keep_versions: int = DEFAULT_KEEP_VERSIONS,
) -> KindOutcome:
    """The return model's turn in the daily job (`run_follower`: never raises), or why it is
    skipped (`ReturnModelKind.skip_reason`)."""
    kind = ReturnModelKind(config, trainer, min_evaluation_samples, keep_versions)
    return run_follower(kind, split, log)
