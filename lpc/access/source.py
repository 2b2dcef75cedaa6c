"""The A/B harness's access-model source: a probability per request from its access features.

Unlike the text sources, which see one turn at a time, access features read a request's time
line (think times, conversation age, the previous request's sizes), so this source takes the
replayed requests themselves (`predict_requests`), in arrival order, training part included so
each conversation's history is complete. Each request's probability uses only its own and
earlier requests' values — what an engine knows when the request releases its blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lpc.errors import InvalidInputError
from lpc.replay.request_table import request_table
from lpc.workload import ScriptedTurn, WorkloadRequest
from predictor.access_features import feature
from predictor.access_predictor import AccessPredictor


@dataclass
class AccessSource:
    predictor: AccessPredictor
    request_types: dict[str, str] | None = None  # request id -> Bailian type
    name: str = "model"
    stats: dict[str, float] = field(default_factory=dict)

    def predict(self, turns: Sequence[ScriptedTurn]) -> list[float | None]:
        raise ValueError(
            "an access-feature model needs each request's timing (arrival, completion): it "
            "predicts from a replayed trace's requests, not from scripted turns"
        )

    def predict_requests(self, requests: Sequence[WorkloadRequest]) -> list[float | None]:
        if not requests:
            return []
        types = None
        if any(feature(n).needs_column == "type" for n in self.predictor.feature_names):
            if self.request_types is None:
                raise InvalidInputError(
                    f"model {self.predictor.path} reads request types, which this trace lacks"
                )
            types = [self.request_types.get(r.request_id, "") for r in requests]
        table = request_table(requests, types)
        return [float(p) for p in self.predictor.predict_table(table)]


def access_source_factory(model: Path, log: Callable[[str], None] = print):
    """A `ModelSourceFactory` for `lpc.replay.ab_run.run_ab` over an access-only artifact."""

    def factory(context) -> AccessSource:
        access_model = AccessPredictor.load(model)
        evaluation = access_model.metadata.metrics.get("evaluation", {})
        quality = (
            f"evaluation AUC {evaluation['roc_auc']:.3f}, MCC {evaluation['mcc']:.3f}"
            if "roc_auc" in evaluation
            else "no held-out metrics"
        )
        log(
            f"model: {model} (access features: {len(access_model.feature_names)}, horizon "
            f"{access_model.horizon_s:g} s; {quality})"
        )
        return AccessSource(access_model, getattr(context, "request_types", None))

    return factory
