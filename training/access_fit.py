"""Train the access-only continuation model and judge it against two references.

The model is a small ReLU MLP (default 2×32) over standardised access features, trained with
BCE and Adam on the fitting slice, keeping the epoch with the lowest validation loss (the
validation slice is later in time than every fitting row, never shuffled across the cut).
Unweighted BCE keeps the probabilities calibrated: LPC's key logit(p) + scale·t mixes p with
time, and the fallback p of a request without a prediction must be on the same scale.

References on the same features and rows, scored on the evaluation part with the same
scikit-learn metrics: a turns-only rate table (the paper's LPC_turns, fitted on horizon
labels) and scikit-learn's HistGradientBoostingClassifier. The MLP stays the served model
unless the gradient-boosted reference beats its evaluation AUC by more than
`GBM_PREFERRED_MARGIN_AUC` (then the report says so; serving a tree ensemble is not built).
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
from training.metrics import classification_metrics

DEFAULT_ACCESS_HIDDEN = (32, 32)
GBM_PREFERRED_MARGIN_AUC = 0.02
ACCESS_EMBEDDER_ID = "none"  # access-only models read no text


@dataclass(frozen=True)
class AccessFitConfig:
    hidden_sizes: tuple[int, ...] = DEFAULT_ACCESS_HIDDEN
    learning_rate: float = 3e-3
    batch_size: int = 256
    max_epochs: int = 60
    patience: int = 8
    seed: int = 0
    threads: int = 2


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


def _fit_mlp(
    samples: AccessSamples, config: AccessFitConfig, mean: np.ndarray, std: np.ndarray
) -> tuple[ContinuationMLP, int]:
    import torch

    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    names = samples.feature_names
    model = ContinuationMLP(MLPConfig(0, config.hidden_sizes, 0.0, tuple(names), turn_column=False))
    x = torch.from_numpy(((samples.features["fit"] - mean) / std).astype(np.float32))
    y = torch.from_numpy(samples.labels["fit"].astype(np.float32))
    vx = torch.from_numpy(((samples.features["validation"] - mean) / std).astype(np.float32))
    vy = torch.from_numpy(samples.labels["validation"].astype(np.float32))
    optimiser = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    generator = torch.Generator().manual_seed(config.seed)
    best_loss, best_state, best_epoch, stale = float("inf"), None, 0, 0
    for epoch in range(1, config.max_epochs + 1):
        model.train()
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), config.batch_size):
            batch = order[start : start + config.batch_size]
            optimiser.zero_grad()
            loss_fn(model(x[batch]), y[batch]).backward()
            optimiser.step()
        model.eval()
        with torch.no_grad():
            val_loss = float(loss_fn(model(vx), vy)) if len(vx) else float("nan")
        if not len(vx) or val_loss < best_loss - 1e-5:
            best_loss, best_epoch, stale = val_loss, epoch, 0
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            stale += 1
            if stale >= config.patience:
                break
    assert best_state is not None
    model.load_state_dict(best_state)
    model.eval()
    return model, best_epoch


def _mlp_probabilities(model: ContinuationMLP, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        logits = model(torch.from_numpy(x.astype(np.float32))).numpy().astype(np.float64)
    return 1.0 / (1.0 + np.exp(-logits))


def fit_access_model(samples: AccessSamples, config: AccessFitConfig) -> AccessFitResult:
    from sklearn.ensemble import HistGradientBoostingClassifier

    for part in ("fit", "validation"):
        labels = samples.labels[part]
        if labels.size == 0 or labels.min() == labels.max():
            raise InvalidInputError(
                f"the {part} slice holds {labels.size} uncensored samples of one class only: "
                f"choose a shorter --horizon (now {samples.horizon_s:g} s) or a later --split-at"
            )
    started = time.perf_counter()
    mean, std = _standardisation(samples.features["fit"])
    model, epochs = _fit_mlp(samples, config, mean, std)
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
    gbm = HistGradientBoostingClassifier(
        max_iter=200, learning_rate=0.05, random_state=config.seed, early_stopping=False
    )
    gbm.fit(samples.features["fit"], samples.labels["fit"])
    probabilities["gbm"] = gbm.predict_proba(eval_x)[:, 1]
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
