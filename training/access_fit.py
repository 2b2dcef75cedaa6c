"""Train the access-only continuation model and judge it against two references.

The model is an average of small ReLU MLPs over standardised access features, by default
distilled from gradient-boosted trees, early-stopped on the validation slice and refitted on
the whole training part; the members merge into one wider MLP, so the artifact and the numpy
predictor stay those of a plain MLP. The references are a turns-only rate table and
scikit-learn's HistGradientBoostingClassifier, on the same features and rows.

The recipe and why each step: docs/design.md, "The access model's recipe".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from predictor.artifact import (
    AccessInput,
    ArtifactInputs,
    ArtifactMetadata,
    save_artifact,
)
from predictor.errors import InvalidInputError
from predictor.model import ContinuationMLP, MLPConfig
from training.access_data import AccessSamples
from training.access_defaults import DEFAULT_ACCESS_ENSEMBLE, DEFAULT_TEACHER_SHARE
from training.metrics import classification_metrics

DEFAULT_ACCESS_HIDDEN = (48, 48, 48)
GBM_PREFERRED_MARGIN_AUC = 0.02
# Shallow, slow-learning trees: the library defaults (31 leaves, 0.1) overfit these ~3k rows
# (validation AUC 0.649 against 0.697 on Mooncake at the default split).
GBM_PARAMS: dict[str, Any] = {
    "max_iter": 100,
    "learning_rate": 0.03,
    "max_depth": 3,
    "min_samples_leaf": 50,
    "early_stopping": False,
}
# The teacher the MLP is fitted to: the reference's trees, twice as many. Of 50, 100, 200, 300
# and 400 trees, 200 gave the distilled MLP the best mean validation AUC over the three
# Mooncake splits (docs/results.md); the reference itself keeps its own validated settings.
TEACHER_GBM_PARAMS: dict[str, Any] = {**GBM_PARAMS, "max_iter": 200}
ACCESS_EMBEDDER_ID = "none"  # access-only models read no text


@dataclass(frozen=True)
class AccessFitConfig:
    hidden_sizes: tuple[int, ...] = DEFAULT_ACCESS_HIDDEN  # of each member
    ensemble: int = DEFAULT_ACCESS_ENSEMBLE  # members, seeds seed … seed + ensemble − 1
    refit: bool = True  # retrain each member on the whole training part for its best epochs
    teacher_share: float = DEFAULT_TEACHER_SHARE  # 0: plain labels, 1: the trees' probabilities
    learning_rate: float = 3e-3
    batch_size: int = 256
    # Fitting to the teacher converges more slowly and more smoothly than to labels: with
    # patience 8 and at most 60 epochs a member could stop on a plateau.
    max_epochs: int = 100
    patience: int = 15
    seed: int = 0
    threads: int = 1  # tiny matrices: a second thread costs more than it gives (4x slower fit)

    def __post_init__(self) -> None:
        if self.ensemble < 1:
            raise InvalidInputError(f"the ensemble needs at least one member, got {self.ensemble}")
        if not 0.0 <= self.teacher_share <= 1.0:
            raise InvalidInputError(
                f"the teacher share must be in [0, 1], got {self.teacher_share}"
            )


@dataclass
class AccessFitResult:
    model: ContinuationMLP
    inputs: ArtifactInputs
    base_rate: float
    metrics: dict[str, Any]
    epochs: int
    fit_seconds: float
    served: str = "mlp"
    notes: list[str] = field(default_factory=list)


def _standardisation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    return mean, np.where(std > 1e-9, std, 1.0)


def _turn_rates(turns: np.ndarray, labels: np.ndarray, max_bin: int = 32) -> dict[int, float]:
    bins = np.minimum(turns, max_bin)
    return {int(b): float(labels[bins == b].mean()) for b in np.unique(bins)}


def turns_only_probabilities(
    rates: dict[int, float], base_rate: float, turns: np.ndarray, max_bin: int = 32
) -> np.ndarray:
    return np.array([rates.get(int(min(t, max_bin)), base_rate) for t in turns], dtype=np.float64)


def _gbm(seed: int, params: dict[str, Any] = GBM_PARAMS):
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(random_state=seed, **params)


def training_targets(x: np.ndarray, y: np.ndarray, config: AccessFitConfig) -> np.ndarray:
    """What the MLP is fitted to on rows `x`: the label, mixed with `teacher_share` of the
    probability that gradient-boosted trees (the reference's kind, `TEACHER_GBM_PARAMS`),
    fitted on these same rows, give them.
    Only training rows are involved: the teacher never sees a validation or evaluation row
    it is not trained on."""
    labels = y.astype(np.float64)
    if config.teacher_share == 0.0:
        return labels
    teacher = _gbm(config.seed, TEACHER_GBM_PARAMS).fit(x, y).predict_proba(x)[:, 1]
    return (1.0 - config.teacher_share) * labels + config.teacher_share * teacher


def _tensors(x: np.ndarray, y: np.ndarray, mean: np.ndarray, std: np.ndarray):
    import torch

    return (
        torch.from_numpy(((x - mean) / std).astype(np.float32)),
        torch.from_numpy(y.astype(np.float32)),
    )


def _train_member(
    names: tuple[str, ...],
    config: AccessFitConfig,
    seed: int,
    train: tuple[Any, Any],
    validation: tuple[Any, Any] | None,
    epochs: int,
) -> tuple[ContinuationMLP, int]:
    """One MLP from `seed`: with a validation set, the epoch of lowest validation loss (early
    stopping); without one, exactly `epochs` epochs."""
    import torch

    from training.loop import permuted_batches, train_loop

    torch.manual_seed(seed)
    model = ContinuationMLP(MLPConfig(0, config.hidden_sizes, 0.0, names, turn_column=False))
    x, y = train
    loss_fn = torch.nn.BCEWithLogitsLoss()
    result = train_loop(
        model,
        lambda model, rows: loss_fn(model(x[rows]), y[rows]),
        permuted_batches(len(x), config.batch_size, torch.Generator().manual_seed(seed)),
        learning_rate=config.learning_rate,
        max_epochs=epochs,
        patience=config.patience,
        validation=None
        if validation is None
        else lambda model: float(loss_fn(model(validation[0]), validation[1])),
    )
    return model, result.best_epoch


def merge_members(members: list[ContinuationMLP]) -> ContinuationMLP:
    """One MLP whose logit is the mean of the members' logits (`training.ensemble`, "mean"):
    exact, so the artifact and the numpy predictor stay a plain MLP's."""
    import torch

    from training.ensemble import linear_layers, merge_layers

    first = members[0].config
    config = MLPConfig(
        0,
        tuple(h * len(members) for h in first.hidden_sizes),
        0.0,
        first.extra_features,
        turn_column=False,
    )
    merged = ContinuationMLP(config)
    layers = merge_layers([linear_layers(member) for member in members], "mean")
    with torch.no_grad():
        for target, (weight, bias) in zip(linear_layers(merged), layers, strict=True):
            target[0].copy_(weight)
            target[1].copy_(bias)
    merged.eval()
    return merged


def _fit_mlp(
    samples: AccessSamples, config: AccessFitConfig
) -> tuple[ContinuationMLP, np.ndarray, np.ndarray, list[int], float]:
    """The merged ensemble, the standardisation it reads, each member's epochs, and the
    validation AUC of the members as trained on the fitting slice alone."""
    import torch
    from sklearn.metrics import roc_auc_score

    torch.set_num_threads(config.threads)
    names = samples.feature_names
    fit_x, fit_y = samples.features["fit"], samples.labels["fit"]
    val_x, val_y = samples.features["validation"], samples.labels["validation"]
    mean, std = _standardisation(fit_x)
    fit_t = _tensors(fit_x, training_targets(fit_x, fit_y, config), mean, std)
    val_t = _tensors(val_x, val_y, mean, std)  # early stopping reads the labels
    members, epochs = [], []
    for seed in range(config.seed, config.seed + config.ensemble):  # as `seeds` below
        member, epoch = _train_member(names, config, seed, fit_t, val_t, config.max_epochs)
        members.append(member)
        epochs.append(epoch)
    early = merge_members(members)
    validation_auc = float(roc_auc_score(val_y, _mlp_probabilities(early, (val_x - mean) / std)))
    if not config.refit:
        return early, mean, std, epochs, validation_auc
    whole_x = np.concatenate([fit_x, val_x])
    whole_y = np.concatenate([fit_y, val_y])
    mean, std = _standardisation(whole_x)
    whole_t = _tensors(whole_x, training_targets(whole_x, whole_y, config), mean, std)
    refitted = [
        _train_member(names, config, seed, whole_t, None, epoch)[0]
        for seed, epoch in zip(
            range(config.seed, config.seed + config.ensemble), epochs, strict=True
        )
    ]
    return merge_members(refitted), mean, std, epochs, validation_auc


def _mlp_probabilities(model: ContinuationMLP, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        logits = model(torch.from_numpy(x.astype(np.float32))).numpy().astype(np.float64)
    return 1.0 / (1.0 + np.exp(-logits))


def check_learnable(samples: AccessSamples) -> None:
    """`InvalidInputError` (one line: what is missing, and where) unless the fitting and the
    validation slice each hold uncensored samples of both classes with finite features; an
    empty slice, a single class or a NaN column would give a model of NaN statistics or one
    that has learnt nothing, and the validation choices nothing to be made on."""
    remedy = f"choose a shorter --horizon (now {samples.horizon_s:g} s) or a later --split-at"
    rows = {p: samples.labels[p].size + samples.censored[p] for p in ("fit", "validation")}
    if sum(rows.values()) == 0:
        raise InvalidInputError(
            "no usable samples: the training part holds no request (a trace whose requests all "
            "arrive at one instant has no span to split; a later --split-at, or a longer trace)"
        )
    for part in ("fit", "validation"):
        if rows[part] == 0:
            raise InvalidInputError(
                f"no usable samples: the {part} slice of the training part holds no request "
                "(a gap in the traffic?): a later --split-at or another --validation-share"
            )
        labels = samples.labels[part]
        if labels.size == 0:
            raise InvalidInputError(
                f"no usable samples: the {part} slice holds no uncensored sample "
                f"({samples.censored[part]} censored): {remedy}"
            )
        if labels.min() == labels.max():
            raise InvalidInputError(
                f"a single class: the {part} slice's {labels.size} uncensored samples are all "
                f"labelled {int(labels[0])}: {remedy}"
            )
        finite = np.isfinite(samples.features[part]).all(axis=0)
        if not finite.all():
            names = [n for n, ok in zip(samples.feature_names, finite, strict=True) if not ok]
            raise InvalidInputError(
                f"non-finite statistics: the {part} slice's feature(s) {', '.join(names)} "
                "hold NaN or infinite values"
            )


def fit_access_model(samples: AccessSamples, config: AccessFitConfig) -> AccessFitResult:
    from sklearn.metrics import roc_auc_score

    check_learnable(samples)
    started = time.perf_counter()
    model, mean, std, member_epochs, validation_auc = _fit_mlp(samples, config)
    epochs = max(member_epochs)
    fit_seconds = time.perf_counter() - started

    train_labels = np.concatenate([samples.labels["fit"], samples.labels["validation"]])
    base_rate = float(samples.labels["fit"].mean())
    evaluation = samples.labels["evaluation"]
    eval_x = samples.features["evaluation"]
    metrics: dict[str, Any] = {"samples": samples.counts(), "horizon_s": samples.horizon_s}
    probabilities: dict[str, np.ndarray] = {}
    probabilities["mlp"] = _mlp_probabilities(model, (eval_x - mean) / std)
    rates = _turn_rates(
        np.concatenate([samples.turn_index["fit"], samples.turn_index["validation"]]),
        train_labels,
    )
    probabilities["turns_only"] = turns_only_probabilities(
        rates, float(train_labels.mean()), samples.turn_index["evaluation"]
    )
    gbm = _gbm(config.seed)
    gbm.fit(samples.features["fit"], samples.labels["fit"])
    gbm_validation_auc = float(
        roc_auc_score(
            samples.labels["validation"], gbm.predict_proba(samples.features["validation"])[:, 1]
        )
    )
    if config.refit:
        gbm.fit(
            np.concatenate([samples.features["fit"], samples.features["validation"]]),
            train_labels,
        )
    probabilities["gbm"] = gbm.predict_proba(eval_x)[:, 1]
    metrics["validation"] = {
        "mlp": {"roc_auc": validation_auc},
        "gbm": {"roc_auc": gbm_validation_auc},
    }
    notes: list[str] = []
    if evaluation.size and 0 < evaluation.sum() < evaluation.size:
        for name, p in probabilities.items():
            metrics[name] = classification_metrics(evaluation, p).to_dict()
        margin = metrics["gbm"]["roc_auc"] - metrics["mlp"]["roc_auc"]
        if margin > GBM_PREFERRED_MARGIN_AUC:
            notes.append(
                f"the gradient-boosted reference beats the MLP by {margin:.3f} AUC (more than "
                f"{GBM_PREFERRED_MARGIN_AUC}); the MLP is still what the artifact holds"
            )
    else:
        notes.append(
            "the evaluation part holds one class only after censoring: no AUC/MCC "
            f"(horizon {samples.horizon_s:g} s too long for the data's span?)"
        )
    inputs = ArtifactInputs(
        text_window=False,
        access_features=tuple(
            AccessInput(n, float(m), float(s))
            for n, m, s in zip(samples.feature_names, mean, std, strict=True)
        ),
        horizon_s=samples.horizon_s,
    )
    metrics["epochs"] = epochs
    metrics["member_epochs"] = member_epochs
    metrics["ensemble"] = config.ensemble
    metrics["member_hidden_sizes"] = list(config.hidden_sizes)
    metrics["refit"] = config.refit
    metrics["teacher_share"] = config.teacher_share
    metrics["fit_seconds"] = round(fit_seconds, 3)
    return AccessFitResult(model, inputs, base_rate, metrics, epochs, fit_seconds, "mlp", notes)


def save_access_model(
    folder: Path, result: AccessFitResult, fingerprint: str, notes: dict[str, Any]
) -> ArtifactMetadata:
    metadata = access_metadata(result, fingerprint, notes)
    return save_artifact(folder, result.model, metadata, overwrite=True)


def access_metadata(
    result: AccessFitResult, fingerprint: str, notes: dict[str, Any]
) -> ArtifactMetadata:
    """The artifact metadata of a fitted access model (the registry saves it itself)."""
    return ArtifactMetadata(
        embedder_id=ACCESS_EMBEDDER_ID,
        feature_config=_unused_feature_config(),
        mlp_config=result.model.config,
        base_rate=result.base_rate,
        metrics={"evaluation": result.metrics.get("mlp", {}), **result.metrics},
        training_data_fingerprint=fingerprint,
        embedder_spec="none",
        notes={**notes, "report_notes": result.notes},
        inputs=result.inputs,
    )


def _unused_feature_config():
    """Text-window settings an access-only artifact carries but never reads."""
    from predictor.features import FeatureConfig

    return FeatureConfig()
