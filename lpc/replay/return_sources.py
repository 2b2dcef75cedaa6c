"""Where the `lpc-return` evictor's return curves come from: one curve per request's release.

A curve says when the releasing conversation's next request arrives, counted from this
request's completion. Three sources: `true-return` (the trace's true next arrival, an upper
bound), `km-turn` (Kaplan–Meier per turn on the training part) and `model` (the return-time
hazard model, trained on the training part alone).

Each source's rules: docs/design.md, "Return-curve sources".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lpc.errors import InvalidInputError
from lpc.workload import WorkloadRequest
from predictor.return_curve import ReturnCurve, log_spaced_edges

if TYPE_CHECKING:  # the model source loads it (and pandas) only when asked for
    from eviction.base import ReturnCurveLike
    from lpc.replay.policies import PolicySpec
    from predictor.return_time import ReturnTimePredictor

CURVE_SOURCES = ("true-return", "km-turn", "model")
DEFAULT_MAX_TURN = 6
DEFAULT_MIN_SAMPLES = 30
NEVER_RETURNS = ReturnCurve(np.array([0.0, 1.0]), np.array([1.0, 1.0]))


def next_arrivals(requests: Sequence[WorkloadRequest]) -> list[float | None]:
    """Per request (in arrival order), its conversation's next arrival (None: no next)."""
    out: list[float | None] = [None] * len(requests)
    last_of: dict[str, int] = {}
    for i, request in enumerate(requests):
        previous = last_of.get(request.conversation_id)
        if previous is not None:
            out[previous] = request.arrival_s
        last_of[request.conversation_id] = i
    return out


def step_curve(return_s: float) -> ReturnCurve:
    """The next request exactly `return_s` after the release (at once when <= 0)."""
    if return_s <= 0.0:
        return ReturnCurve(np.array([0.0, 1e-9]), np.array([1.0, 0.0]))
    return ReturnCurve(
        np.array([0.0, return_s * (1.0 - 1e-9), return_s]), np.array([1.0, 1.0, 0.0])
    )


def true_return_curves(requests: Sequence[WorkloadRequest]) -> list[ReturnCurve]:
    """Perfect knowledge: each release's true time to the conversation's next arrival."""
    return [
        NEVER_RETURNS if nxt is None else step_curve(nxt - request.completion_s)
        for request, nxt in zip(requests, next_arrivals(requests), strict=True)
    ]


def kaplan_meier(durations: np.ndarray, observed: np.ndarray, grid_s: np.ndarray) -> np.ndarray:
    """Product-limit survival S(t) at `grid_s` (grid_s[0] = 0, where S = 1): events at or
    before t count; a duration censored at c leaves the risk set after c."""
    order = np.argsort(durations, kind="stable")
    d, e = durations[order], observed[order]
    times = np.unique(d[e])
    survival_at_event = []
    s = 1.0
    for t in times:
        at_risk = np.count_nonzero(d >= t)
        events = np.count_nonzero((d == t) & e)
        s *= 1.0 - events / at_risk
        survival_at_event.append(s)
    out = np.ones(len(grid_s))
    if len(times):
        k = np.searchsorted(times, grid_s, side="right")  # events at or before each point
        values = np.concatenate([[1.0], survival_at_event])
        out = values[k]
    out[0] = 1.0
    return np.minimum.accumulate(out)


@dataclass(frozen=True)
class TurnReturnCurves:
    """Kaplan–Meier return curves per turn number (1-based, capped at `max_turn`)."""

    by_turn: dict[int, ReturnCurve]
    pooled: ReturnCurve
    max_turn: int
    samples: dict[int, int]

    @classmethod
    def fit(
        cls,
        requests: Sequence[WorkloadRequest],
        first_eval: int,
        grid_s: np.ndarray | None = None,
        max_turn: int = DEFAULT_MAX_TURN,
        min_samples: int = DEFAULT_MIN_SAMPLES,
    ) -> TurnReturnCurves:
        """Fit on requests [0, first_eval) (the training part), censored at its end: the
        arrival of the first evaluation request (or the last arrival when there is none)."""
        grid = log_spaced_edges() if grid_s is None else np.asarray(grid_s, float)
        if first_eval < len(requests):
            end_s = requests[first_eval].arrival_s
        else:
            end_s = requests[-1].arrival_s if requests else 0.0
        nxt = next_arrivals(requests)
        per_turn: dict[int, tuple[list[float], list[bool]]] = {}
        for request, next_s in zip(requests[:first_eval], nxt[:first_eval], strict=True):
            release = request.completion_s
            if release >= end_s:
                continue  # released after the part ends: nothing seen
            turn = min(request.turn.turn_index + 1, max_turn)
            durations, observed = per_turn.setdefault(turn, ([], []))
            if next_s is not None and next_s < end_s:
                durations.append(max(0.0, next_s - release))
                observed.append(True)
            else:
                durations.append(end_s - release)
                observed.append(False)
        all_d = np.array([d for ds, _ in per_turn.values() for d in ds], float)
        all_e = np.array([o for _, os in per_turn.values() for o in os], bool)
        pooled = ReturnCurve(grid, kaplan_meier(all_d, all_e, grid))
        by_turn = {
            turn: ReturnCurve(grid, kaplan_meier(np.array(ds, float), np.array(os, bool), grid))
            for turn, (ds, os) in per_turn.items()
            if len(ds) >= min_samples
        }
        samples = {turn: len(ds) for turn, (ds, _) in per_turn.items()}
        return cls(by_turn, pooled, max_turn, samples)

    def curve_for(self, request: WorkloadRequest) -> ReturnCurve:
        turn = min(request.turn.turn_index + 1, self.max_turn)
        return self.by_turn.get(turn, self.pooled)

    def curves(self, requests: Sequence[WorkloadRequest]) -> list[ReturnCurve]:
        return [self.curve_for(r) for r in requests]


def load_return_model(folder: Path | str, tail: str = "flat") -> ReturnTimePredictor:
    """The return-time artifact at `folder`, its curves with `tail` beyond the grid
    (`predictor.return_time.TAILS`); an artifact that is not one (e.g. the 180-s classifier)
    or is damaged raises a one-line `ArtifactError`."""
    from predictor.return_time import ReturnTimePredictor

    folder = Path(folder)
    if not (folder / "metadata.json").is_file():
        raise InvalidInputError(f"return model {folder}: no metadata.json (not an artifact)")
    return ReturnTimePredictor.load(folder, tail)


def check_trained_before(model: ReturnTimePredictor, trace: str | None, first_eval: int) -> None:
    """Refuse a model that has seen this replay's evaluation part: one trained on the same
    trace (its recorded name) with more training requests than this replay's training part.
    A model of another trace, or one recording no split, is not checked here."""
    notes = model.metadata.notes
    trained = notes.get("split", {}).get("train_requests")
    if trace is None or notes.get("trace") != str(trace) or trained is None:
        return
    if int(trained) > first_eval:
        raise InvalidInputError(
            f"return model {model.path} was trained on the first {trained} requests of "
            f"{trace}, past this replay's training part ({first_eval}): train one at this "
            "split (lpc train-return --split-at S --out DIR) and pass --return-model DIR"
        )


def model_curves(
    model: ReturnTimePredictor, requests: Sequence[WorkloadRequest]
) -> list[ReturnCurve]:
    """The model's curve for every request (arrival order, training part included, so each
    conversation's history is complete), each from what an engine knows at its release."""
    from lpc.replay.request_table import request_table
    from predictor.access_features import feature

    if not requests:
        return []
    needs = sorted({c for n in model.feature_names if (c := feature(n).needs_column)})
    if needs:
        raise InvalidInputError(
            f"return model {model.path} reads column(s) {', '.join(needs)}, which the "
            "replayed requests do not carry"
        )
    return model.curves_of(model.survival_table(request_table(requests)))


def return_curves(
    name: str,
    requests: Sequence[WorkloadRequest],
    first_eval: int,
    model: ReturnTimePredictor | None = None,
) -> list[ReturnCurve]:
    """The named source's curve for every request (`first_eval`: the evaluation part's
    first request; the training part before it fits `km-turn`; `model` feeds `model`)."""
    if name == "true-return":
        return true_return_curves(requests)
    if name == "km-turn":
        return TurnReturnCurves.fit(requests, first_eval).curves(requests)
    if name == "model":
        if model is None:
            raise InvalidInputError(
                "the 'model' return-curve source needs a return-time model (--return-model DIR)"
            )
        return model_curves(model, requests)
    raise ValueError(f"unknown return-curve source {name!r}; known: {', '.join(CURVE_SOURCES)}")


def request_curves(
    curves: Mapping[str, Sequence[ReturnCurveLike | None]], spec: PolicySpec, count: int
) -> Sequence[ReturnCurveLike | None]:
    """The curve each of `count` requests releases its blocks with under `spec`: none for a
    policy without a curve source, else the prepared source's curves (which must be there)."""
    if spec.curve_source is None:
        return [None] * count
    try:
        return curves[spec.curve_source]
    except KeyError:
        raise ValueError(
            f"policy {spec.label!r} needs the {spec.curve_source!r} return curves, "
            "which this workload was not prepared with"
        ) from None
