"""Model quality on one prequential window: the releases arriving in [t, t + Δ).

The trainers (`lpc.access.training`, `lpc.access.return_training`) score the whole part after
their cut; a prequential window asks how the models trained before t do on the next Δ only.
The window's rows are scored exactly as the evaluation part's are, with targets seen from the
whole trace (a return after t + Δ is still a return): the classifier's ROC-AUC at its horizon
on the rows whose label is known (`training.access_data.horizon_labels`), the hazard model's
C, integrated Brier score and AUC at 60 / 180 / 600 s with IPCW from the window's training part
(`training.return_quality`). Every figure carries a 95 % bootstrap interval over the window's
conversations (`training.quality_intervals` for the hazard model and Kaplan–Meier, the same
draws for both). Why conversations: docs/design.md, "Statistics: paired intervals".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from predictor.access_features import feature_frame
from predictor.access_predictor import AccessPredictor
from predictor.return_time import ReturnTimePredictor
from training.access_data import DEFAULT_VALIDATION_FRACTION, horizon_labels
from training.paired_bootstrap import (
    CONFIDENCE,
    N_RESAMPLES,
    SEED,
    percentile_interval,
    resample_weights,
)
from training.quality_intervals import CurveSource, quality_intervals
from training.return_data import return_samples
from training.return_fit import fit_turn_kaplan_meier, km_grid
from training.return_quality import curve_quality
from training.survival_metrics import censoring_survival


@dataclass(frozen=True)
class Estimate:
    """A figure on the window and its bootstrap interval (None when it cannot be resampled)."""

    value: float
    low: float | None
    high: float | None

    def to_dict(self) -> dict[str, float | None]:
        return {"value": self.value, "ci95": None if self.low is None else [self.low, self.high]}


def conversation_bootstrap(
    statistic: Callable[[np.ndarray], float],
    conversations: np.ndarray,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> Estimate:
    """`statistic(weights)` on every row (weights 1), and its percentile interval when the
    window's conversations are resampled with replacement: a row's weight is how often its
    conversation was drawn. Resamples where the statistic is undefined (NaN: one class left)
    are skipped."""
    value = statistic(np.ones(len(conversations)))
    if np.unique(conversations).size < 2:
        return Estimate(value, None, None)
    weights = resample_weights(conversations, n_resamples, seed)
    interval = percentile_interval(np.array([statistic(w) for w in weights]), confidence)
    return Estimate(value, *(interval or (None, None)))


def _weighted_auc(labels: np.ndarray, scores: np.ndarray) -> Callable[[np.ndarray], float]:
    def auc(weights: np.ndarray) -> float:
        kept = weights > 0
        if len(np.unique(labels[kept])) < 2:
            return float("nan")
        return float(roc_auc_score(labels[kept], scores[kept], sample_weight=weights[kept]))

    return auc


def window_rows(table: pd.DataFrame, start_s: float, end_s: float) -> np.ndarray:
    """Positions (in the arrival-sorted table) of the requests arriving in [start_s, end_s)."""
    arrivals = table["arrival_s"].to_numpy()
    return np.arange(
        int(np.searchsorted(arrivals, start_s, side="left")),
        int(np.searchsorted(arrivals, end_s, side="left")),
    )


def classifier_quality(
    table: pd.DataFrame,
    classifier: AccessPredictor,
    start_s: float,
    end_s: float,
    horizon_s: float,
    n_resamples: int = N_RESAMPLES,
) -> dict[str, Any]:
    """ROC-AUC of P(return within `horizon_s`) on the window's labelled releases."""
    rows = window_rows(table, start_s, end_s)
    labels = horizon_labels(table, horizon_s, float(table["arrival_s"].iloc[-1])).to_numpy()
    rows = rows[~np.isnan(labels[rows])]
    y = labels[rows].astype(np.int64)
    p = classifier.predict(feature_frame(table, classifier.feature_names).to_numpy()[rows])
    conversations = table["conversation_id"].to_numpy()[rows]
    auc = conversation_bootstrap(_weighted_auc(y, p), conversations, n_resamples)
    return {
        "horizon_s": horizon_s,
        "samples": int(y.size),
        "positive_rate": float(y.mean()) if y.size else 0.0,
        "roc_auc": auc.to_dict(),
    }


def hazard_quality(
    table: pd.DataFrame,
    model: ReturnTimePredictor,
    start_s: float,
    end_s: float,
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION,
    n_resamples: int = N_RESAMPLES,
) -> dict[str, Any]:
    """C, integrated Brier and AUC(t) of the hazard model on the window's releases, beside
    Kaplan–Meier per turn fitted on the same training part (the cut at `start_s`), each with
    its 95 % interval and the model − KM differences paired (`training.quality_intervals`);
    targets censored at the trace's end, G from the training part."""
    samples = return_samples(table, model.feature_names, start_s, validation_fraction)
    training, evaluation = samples.parts["training"], samples.parts["evaluation"]
    end_row = int(np.searchsorted(table["arrival_s"].to_numpy(), end_s, side="left"))
    inside = evaluation.rows < end_row
    t = evaluation.targets.time_s[inside]
    e = evaluation.targets.observed[inside]
    features = evaluation.features[inside]
    censoring = censoring_survival(training.targets.time_s, training.targets.observed)
    survival = model.survival(features)
    turn_km = fit_turn_kaplan_meier(training, km_grid(model.grid_s))
    km_survival = turn_km.survival(evaluation.turn_index[inside])
    conversations = table["conversation_id"].to_numpy()[evaluation.rows[inside]]
    sources = {
        "model": CurveSource(model.grid_s, survival),
        "km_per_turn": CurveSource(turn_km.grid_s, km_survival),
    }
    intervals = quality_intervals(
        t,
        e,
        conversations,
        sources,
        censoring,
        n_resamples,
        differences=(("model", "km_per_turn"),),
    )
    model_ci = intervals["sources"]["model"]
    return {
        "samples": int(t.size),
        "returned": int(e.sum()),
        "model": {
            **curve_quality(t, e, model.grid_s, survival, censoring),
            "concordance_ci95": model_ci["concordance"],
            "ci95": model_ci,
        },
        "km_per_turn": {
            **curve_quality(t, e, turn_km.grid_s, km_survival, censoring),
            "ci95": intervals["sources"]["km_per_turn"],
        },
        "model_minus_km_ci95": intervals["differences"]["model - km_per_turn"],
    }
