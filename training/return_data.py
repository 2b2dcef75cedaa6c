"""Samples for the return-time model: time to the next request, censored at the data's end.

The duration runs from this request's completion to the arrival of the conversation's next
request, as the 180-s classifier's label measures it; a request with no next request seen is
censored at the end of the data it is labelled from. Features are the classifier's, from the
same `feature_frame`.

Each part's labels and the validation slice: docs/design.md, "Return-time samples".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from predictor.access_features import feature_frame
from training.access_data import (
    DEFAULT_VALIDATION_FRACTION,
    TimeParts,
    before,
    time_parts,
    turn_indices,
)


@dataclass(frozen=True)
class ReturnTargets:
    """Per row: seconds to the next arrival or to the censoring, and whether it was seen."""

    time_s: np.ndarray
    observed: np.ndarray  # True: the next request came at time_s; False: censored there


def return_targets(table: pd.DataFrame, end_s: float) -> ReturnTargets:
    """Targets of every row of `table` (sorted by arrival) as seen from data ending at
    `end_s`: a next request arriving after `end_s` is unknown, so its row is censored at
    `end_s − completion` (0 when the request completes after `end_s`). Rows arriving after
    `end_s` get NaN time (not data of this labelling)."""
    seen = (table["arrival_s"] <= end_s).to_numpy()
    arrivals = table["arrival_s"].where(seen)
    next_arrival = arrivals.groupby(table["conversation_id"], sort=False).shift(-1).to_numpy()
    completion = table["completion_s"].to_numpy(np.float64)
    observed = seen & ~np.isnan(next_arrival)
    time_s = np.where(
        observed,
        np.maximum(0.0, next_arrival - completion),
        np.maximum(0.0, end_s - completion),
    )
    time_s = np.where(seen, time_s, np.nan)
    return ReturnTargets(time_s, observed)


@dataclass(frozen=True)
class ReturnPart:
    """One part's rows: raw features, targets, and the turn of each (for KM per turn)."""

    features: np.ndarray
    targets: ReturnTargets
    turn_index: np.ndarray
    rows: np.ndarray  # positions in the arrival-sorted table

    @property
    def size(self) -> int:
        return int(self.turn_index.size)

    def counts(self) -> dict[str, int | float]:
        observed = self.targets.observed
        return {
            "samples": self.size,
            "returned": int(observed.sum()),
            "censored": int((~observed).sum()),
            "returned_within_180_s": float(
                np.mean(observed & (self.targets.time_s <= 180.0)) if self.size else 0.0
            ),
        }


@dataclass(frozen=True)
class ReturnSamples:
    """The parts: fit / validation (choices), training (fit + validation, the refit and the
    baselines), evaluation (scored only)."""

    feature_names: tuple[str, ...]
    parts: dict[str, ReturnPart]
    cuts: TimeParts
    span_start_s: float
    validation_slice: str = "span"  # or "releases": how the slice was cut (`validation_slice`)


def validation_slice(
    arrivals: np.ndarray, cuts: TimeParts, validation_fraction: float
) -> tuple[TimeParts, str]:
    """The cuts of the validation slice: `cuts` (the training part's last share of its span)
    when that slice holds a release, else the last share of the training part's releases,
    moved back to the first release arriving at the same instant as its first one (a slice
    never splits one arrival time). An empty training part, or one arriving all at one
    instant, keeps an empty slice: the fit refuses it (`training.return_fit.check_learnable`)."""
    n = cuts.evaluation
    if cuts.validation < n or n < 2:
        return cuts, "span"
    first = n - max(1, round(validation_fraction * n))
    first = int(np.searchsorted(arrivals[:n], arrivals[first], side="left"))
    if first == 0:
        return cuts, "span"
    moved = TimeParts(first, n, float(arrivals[first]), cuts.evaluation_cut_s)
    return moved, "releases"


def return_samples(
    table: pd.DataFrame,
    feature_names: Sequence[str],
    cut_s: float,
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION,
) -> ReturnSamples:
    table = table.reset_index(drop=True)
    cuts, rule = validation_slice(
        table["arrival_s"].to_numpy(np.float64),
        time_parts(table, cut_s, validation_fraction),
        validation_fraction,
    )
    values = feature_frame(table, feature_names).to_numpy()
    turn_index = turn_indices(table)
    end_s = float(table["arrival_s"].iloc[-1])
    ranges = {
        "fit": (0, cuts.validation, before(cuts.validation_cut_s)),
        "validation": (cuts.validation, cuts.evaluation, before(cuts.evaluation_cut_s)),
        "training": (0, cuts.evaluation, before(cuts.evaluation_cut_s)),
        "evaluation": (cuts.evaluation, len(table), end_s),
    }
    parts = {}
    for name, (lo, hi, end) in ranges.items():
        targets = return_targets(table, end)
        rows = np.arange(lo, hi)
        parts[name] = ReturnPart(
            values[lo:hi],
            ReturnTargets(targets.time_s[lo:hi], targets.observed[lo:hi]),
            turn_index[lo:hi],
            rows,
        )
    start = float(table["arrival_s"].iloc[0]) if len(table) else 0.0
    return ReturnSamples(tuple(feature_names), parts, cuts, start, rule)
