"""Samples for access-feature training: horizon labels with censoring, split by time.

Label: "the conversation's next request arrives within `horizon_s` of this one's completion".
A request without a next request whose horizon runs past the end of the data it is labelled
from is censored: dropped, never labelled 0. Each part is labelled only from what it holds.

Why a horizon, and how each part's labels end: docs/design.md, "Horizon labels and
censoring".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from predictor.access_features import completion_order, feature_frame
from predictor.errors import InvalidInputError
from training.access_defaults import DEFAULT_ACCESS_HORIZON_S

DEFAULT_VALIDATION_FRACTION = 0.3


def horizon_labels(table: pd.DataFrame, horizon_s: float, end_s: float) -> pd.Series:
    """1.0 / 0.0 per request, NaN where censored. Only rows arriving before `end_s` count as
    data: a later next request is unknown to this labelling."""
    if not horizon_s > 0:
        raise InvalidInputError(f"the horizon must be > 0 seconds, got {horizon_s}")
    seen = table["arrival_s"] <= end_s
    arrivals = table["arrival_s"].where(seen)
    # Sorted by arrival: a conversation's next row is its next request, NaN when that one
    # arrives after `end_s` (every later one does too).
    next_arrival = arrivals.groupby(table["conversation_id"], sort=False).shift(-1).where(seen)
    gap = next_arrival - table["completion_s"]
    labels = pd.Series(np.nan, index=table.index)
    labels[gap.notna()] = (gap[gap.notna()] <= horizon_s).astype(np.float64)
    ended = gap.isna() & seen & (table["completion_s"] + horizon_s <= end_s)
    labels[ended] = 0.0
    return labels


def before(cut_s: float) -> float:
    """The labelling end of a part that stops at a cut: the part holds the arrivals before
    the cut (`time_parts`, `split_in_time`), so its labels must not read one arriving exactly
    at it (a trace in whole seconds has many); the labelling functions include their end."""
    return float(np.nextafter(cut_s, -np.inf))


@dataclass(frozen=True)
class TimeParts:
    """Row ranges of a table sorted by arrival: fit [0, validation), validation
    [validation, evaluation), evaluation [evaluation, n)."""

    validation: int
    evaluation: int
    validation_cut_s: float
    evaluation_cut_s: float


def time_parts(
    table: pd.DataFrame, cut_s: float, validation_fraction: float = DEFAULT_VALIDATION_FRACTION
) -> TimeParts:
    if not 0 < validation_fraction < 1:
        raise InvalidInputError(f"validation fraction must be in (0, 1), got {validation_fraction}")
    arrivals = table["arrival_s"].to_numpy()
    start = float(arrivals[0]) if len(arrivals) else 0.0
    validation_cut = start + (1 - validation_fraction) * (cut_s - start)
    return TimeParts(
        int(np.searchsorted(arrivals, validation_cut, side="left")),
        int(np.searchsorted(arrivals, cut_s, side="left")),
        validation_cut,
        cut_s,
    )


@dataclass(frozen=True)
class AccessSamples:
    """Raw features and labels of the kept (uncensored) rows of each part."""

    feature_names: tuple[str, ...]
    features: dict[str, np.ndarray]  # part -> (n, k)
    labels: dict[str, np.ndarray]  # part -> (n,) 0/1
    turn_index: dict[str, np.ndarray]  # part -> (n,) for the turns-only baseline
    censored: dict[str, int]
    parts: TimeParts
    horizon_s: float

    def counts(self) -> dict[str, dict[str, float | int]]:
        return {
            part: {
                "samples": int(self.labels[part].size),
                "positive_rate": float(self.labels[part].mean()) if self.labels[part].size else 0.0,
                "censored": self.censored[part],
            }
            for part in self.labels
        }


def turn_indices(table: pd.DataFrame) -> np.ndarray:
    """Each row's turn for the turns-only baseline: earlier requests of its conversation that
    finished before it, as the `log_turn` feature counts them."""
    order = completion_order(table["completion_s"].to_numpy())
    turn_index = np.empty(len(table), dtype=np.int64)
    turn_index[order] = table.iloc[order].groupby("conversation_id", sort=False).cumcount()
    return turn_index


def access_samples(
    table: pd.DataFrame,
    feature_names: Sequence[str],
    cut_s: float,
    horizon_s: float = DEFAULT_ACCESS_HORIZON_S,
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION,
) -> AccessSamples:
    """Features of every row from its past, labels per part from that part's own data."""
    table = table.reset_index(drop=True)
    parts = time_parts(table, cut_s, validation_fraction)
    values = feature_frame(table, feature_names).to_numpy()
    turn_index = turn_indices(table)
    end_s = float(table["arrival_s"].iloc[-1])
    ranges = {
        "fit": (0, parts.validation, before(parts.validation_cut_s)),
        "validation": (parts.validation, parts.evaluation, before(parts.evaluation_cut_s)),
        "evaluation": (parts.evaluation, len(table), end_s),
    }
    features, labels, turns, censored = {}, {}, {}, {}
    for part, (lo, hi, end) in ranges.items():
        # Labels of a part come from the rows up to its end only (`horizon_labels` ignores
        # later arrivals), so no part's label looks past the data it is labelled from.
        part_labels = horizon_labels(table, horizon_s, end).to_numpy()[lo:hi]
        keep = ~np.isnan(part_labels)
        features[part] = values[lo:hi][keep]
        labels[part] = part_labels[keep].astype(np.int64)
        turns[part] = turn_index[lo:hi][keep]
        censored[part] = int((~keep).sum())
    return AccessSamples(
        tuple(feature_names), features, labels, turns, censored, parts, float(horizon_s)
    )
