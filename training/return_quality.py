"""The quality table of a return-time source on a scored part: C, integrated Brier, AUC(t).

Fixed before any evaluation part was read:
- **concordance**: Harrell's C with the risk 1 − S(180 s) (the chance of a return within the
  classifier's horizon, so a survival model and the 180-s classifier rank by the same
  question; a median is no use here, since most curves never fall below 0.5);
- **integrated Brier score**: IPCW (censoring distribution G by Kaplan–Meier on the
  training part), trapezoid over `IBS_GRID_S`: 5 s to 600 s, the first model grid point to
  the replay's memory window, every 5 s;
- **AUC at 60 / 180 / 600 s**: cumulative/dynamic, IPCW with the same G, risk 1 − S(t);
- **Brier at 60 / 180 / 600 s**, the points the integral runs through.
A source that answers only at one horizon (the 180-s classifier: p = P(return within
180 s), i.e. S(180 s) = 1 − p) gets C, AUC and Brier at 180 s, and nothing else: mapping
one probability to a whole curve would be a model of its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from training.survival_metrics import (
    StepSurvival,
    brier_score,
    concordance_index,
    cumulative_dynamic_auc,
    integrated_brier_score,
    survival_on_times,
)

HORIZONS_S = (60.0, 180.0, 600.0)
CONCORDANCE_HORIZON_S = 180.0
IBS_GRID_S = np.arange(5.0, 600.0 + 1e-9, 5.0)


def curve_quality(
    time_s: np.ndarray,
    observed: np.ndarray,
    grid_s: np.ndarray,
    survival: np.ndarray,
    censoring: StepSurvival,
) -> dict[str, Any]:
    """Quality of curves given as (n, len(grid_s)) survival on one grid."""
    at = survival_on_times(grid_s, survival, np.array([*HORIZONS_S, CONCORDANCE_HORIZON_S]))
    risk = 1.0 - at[:, -1]
    on_ibs = survival_on_times(grid_s, survival, IBS_GRID_S)
    return {
        "concordance": concordance_index(time_s, observed, risk),
        "integrated_brier": integrated_brier_score(time_s, observed, on_ibs, IBS_GRID_S, censoring),
        "auc": {
            f"{t:g}": cumulative_dynamic_auc(time_s, observed, 1.0 - at[:, k], t, censoring)
            for k, t in enumerate(HORIZONS_S)
        },
        "brier": {
            f"{t:g}": brier_score(time_s, observed, at[:, k], t, censoring)
            for k, t in enumerate(HORIZONS_S)
        },
    }


def horizon_quality(
    time_s: np.ndarray,
    observed: np.ndarray,
    p_within: np.ndarray,
    horizon_s: float,
    censoring: StepSurvival,
) -> dict[str, Any]:
    """Quality of a classifier's P(return within `horizon_s`): only what that answers."""
    key = f"{horizon_s:g}"
    return {
        "concordance": concordance_index(time_s, observed, p_within),
        "integrated_brier": None,
        "auc": {key: cumulative_dynamic_auc(time_s, observed, p_within, horizon_s, censoring)},
        "brier": {key: brier_score(time_s, observed, 1.0 - p_within, horizon_s, censoring)},
    }
