"""A gradient-boosted teacher for the return-time hazard, whose logits a small MLP learns.

The 180-s classifier's recipe (distil gradient-boosted trees into MLPs) applied to a
discrete-time hazard: scikit-learn's `HistGradientBoostingClassifier` on person-period rows
gives h_k(x) for every interval, and the student — an MLP of the served kind — regresses its K
logits onto the teacher's. Only the student is served: the numpy predictor stays in
microseconds. Whether a distilled student is served at all is `training.return_fit`'s rule.

The person-period rows and the teacher's settings: docs/design.md, "The return-time fit".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from training.return_data import ReturnPart
from training.return_grid import interval_index

LOGIT_CLIP = 1e-6  # teacher hazards are clipped to [1e-6, 1 − 1e-6] before the logit


# scikit-learn's HistGradientBoostingClassifier settings of the teacher (docs/design.md,
# "The return-time fit")
HAZARD_TEACHER_PARAMS: dict[str, Any] = {
    "learning_rate": 0.05,
    "max_iter": 400,
    "min_samples_leaf": 40,
}


@dataclass(frozen=True)
class PersonPeriod:
    """The person-period rows of a part: features with the interval's log end time last."""

    x: np.ndarray  # (rows, features + 1)
    label: np.ndarray  # (rows,) 1: the return fell in this interval
    weight: np.ndarray  # (rows,) the observed share of the interval


def person_period(part: ReturnPart, grid_s: np.ndarray) -> PersonPeriod:
    """One row per (release, interval at risk), vectorised."""
    grid_s = np.asarray(grid_s, float)
    intervals = len(grid_s) - 1
    index = interval_index(grid_s, part.targets.time_s)
    event = np.asarray(part.targets.observed, bool) & ~index.beyond
    last = index.interval  # 1-based; the last interval for a return beyond the grid
    k = np.arange(1, intervals + 1)
    at_risk = k[None, :] <= last[:, None]  # (n, K)
    before = k[None, :] < last[:, None]
    in_last = at_risk & ~before
    weight = np.where(before, 1.0, np.where(event[:, None], 1.0, index.weight[:, None]))
    label = (in_last & event[:, None]).astype(np.int8)
    keep = at_risk & (weight > 0.0)
    rows, cols = np.nonzero(keep)
    x = np.concatenate(
        [part.features[rows], np.log(grid_s[1:])[cols][:, None]], axis=1, dtype=np.float64
    )
    return PersonPeriod(x, label[rows, cols], weight[rows, cols])


class HazardTeacher:
    """h_k(x) for every interval of a grid, from gradient-boosted trees on person periods."""

    def __init__(
        self,
        grid_s: np.ndarray,
        params: dict[str, Any] = HAZARD_TEACHER_PARAMS,
        seed: int = 0,
    ):
        self.grid_s = np.asarray(grid_s, float)
        self.params = params
        self.seed = seed
        self._model = None

    def fit(self, part: ReturnPart) -> HazardTeacher:
        from sklearn.ensemble import HistGradientBoostingClassifier

        rows = person_period(part, self.grid_s)
        if len(np.unique(rows.label)) < 2:
            raise ValueError(
                "the hazard teacher needs returns and non-returns in its part; "
                f"got {len(rows.label)} person-period rows of one label"
            )
        self._model = HistGradientBoostingClassifier(**self.params, random_state=self.seed).fit(
            rows.x, rows.label, sample_weight=rows.weight
        )
        return self

    @property
    def iterations(self) -> int:
        if self._model is None:
            raise RuntimeError("the teacher is not fitted")
        return int(self._model.n_iter_)

    def logits(self, features: np.ndarray) -> np.ndarray:
        """(n, K) hazard logits for raw features (n, f)."""
        if self._model is None:
            raise RuntimeError("the teacher is not fitted")
        features = np.asarray(features, np.float64)
        n, intervals = len(features), len(self.grid_s) - 1
        if n == 0:  # scikit-learn refuses an empty batch; no rows have no logits
            return np.zeros((0, intervals))
        log_end = np.log(self.grid_s[1:])
        x = np.concatenate(
            [np.repeat(features, intervals, axis=0), np.tile(log_end, n)[:, None]], axis=1
        )
        p = self._model.predict_proba(x)[:, 1].reshape(n, intervals)
        p = np.clip(p, LOGIT_CLIP, 1.0 - LOGIT_CLIP)
        return np.log(p / (1.0 - p))
