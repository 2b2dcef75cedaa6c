"""The quality table of a return-time source on a scored part: C, integrated Brier, AUC(t).

Harrell's C with the risk 1 − S(180 s), the IPCW integrated Brier score over `IBS_GRID_S`, and
AUC and Brier at 60 / 180 / 600 s, all fixed before any evaluation part was read; a source
that answers only at one horizon gets only that horizon's figures.

The table's definitions: docs/design.md, "The return-time quality table".
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
