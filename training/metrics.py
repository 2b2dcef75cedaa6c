"""Held-out quality of a continuation predictor, computed with scikit-learn.

The paper reports MCC and macro-F1 at a 0.5 threshold; we add ROC-AUC (threshold-free: how
well the probabilities *order* turns, which is all the evictor uses) and the Brier score
(calibration). Probabilities from a class-weighted model are shifted towards 0.5, which leaves
MCC, F1 and AUC meaningful but raises the Brier score; `brier_prior_corrected` undoes the
shift (a constant in logit space) for a fair calibration number.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class ClassificationMetrics:
    samples: int
    positive_rate: float
    predicted_positive_rate: float
    mcc: float
    macro_f1: float
    roc_auc: float
    brier: float
    accuracy: float
    threshold: float

    def to_dict(self) -> dict[str, float | int]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def classification_metrics(
    labels: np.ndarray, probabilities: np.ndarray, threshold: float = 0.5
) -> ClassificationMetrics:
    """MCC, macro-F1, ROC-AUC, Brier and accuracy of `probabilities` against 0/1 `labels`."""
    from sklearn.metrics import (
        accuracy_score,
        brier_score_loss,
        f1_score,
        matthews_corrcoef,
        roc_auc_score,
    )

    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    probabilities = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    if labels.shape != probabilities.shape:
        raise ValueError(f"{labels.shape[0]} labels but {probabilities.shape[0]} probabilities")
    if labels.size == 0:
        raise ValueError("cannot score zero samples")
    if not np.all(np.isfinite(probabilities)) or probabilities.min() < 0 or probabilities.max() > 1:
        raise ValueError("probabilities must be finite and in [0, 1]")
    predicted = (probabilities >= threshold).astype(np.int64)
    both_classes = 0 < labels.sum() < labels.size
    return ClassificationMetrics(
        samples=int(labels.size),
        positive_rate=float(labels.mean()),
        predicted_positive_rate=float(predicted.mean()),
        mcc=float(matthews_corrcoef(labels, predicted)),
        macro_f1=float(f1_score(labels, predicted, average="macro", zero_division=0)),
        roc_auc=float(roc_auc_score(labels, probabilities)) if both_classes else float("nan"),
        brier=float(brier_score_loss(labels, probabilities)),
        accuracy=float(accuracy_score(labels, predicted)),
        threshold=float(threshold),
    )


def prior_shift(probabilities: np.ndarray, from_rate: float, to_rate: float) -> np.ndarray:
    """Move probabilities trained under class prior `from_rate` to prior `to_rate` (Bayes:
    add the difference of the prior log-odds). Order-preserving."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), 1e-7, 1 - 1e-7)
    shift = np.log(to_rate / (1 - to_rate)) - np.log(from_rate / (1 - from_rate))
    return 1.0 / (1.0 + np.exp(-(np.log(p / (1 - p)) + shift)))


def brier_prior_corrected(
    labels: np.ndarray, probabilities: np.ndarray, weighted_rate: float, base_rate: float
) -> float:
    """Brier score after undoing class weighting (the model saw positives at `weighted_rate`,
    0.5 for balanced weights; the data has `base_rate`)."""
    from sklearn.metrics import brier_score_loss

    corrected = prior_shift(probabilities, weighted_rate, base_rate)
    return float(brier_score_loss(np.asarray(labels).astype(np.int64), corrected))
