"""The daily job on the serving engine's own request logs: an access-only candidate.

`lpc retrain --logs DIR` hands the files it selected here when they are request logs
(`lpc.integrations.request_log`; they hold no text, so the candidate is an access-only model,
as `lpc train --trace` trains). The newest UTC day of the logs is the evaluation part: the
candidate fits on the days before it and is judged on it, beside the current model, on the
same samples. Labels: the conversation's next request within the horizon of this one's
completion, censored (dropped) where the horizon runs past the data's end.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lpc.ab_pipeline import TRACE_MAX_MODEL_LEN
from lpc.access_table import request_table
from lpc.integrations.request_log import FILE_PATTERN
from lpc.traces.load import TraceOptions, load_trace
from lpc.traces.timeline import split_in_time
from predictor.access_features import default_feature_names
from training.access_data import (
    DEFAULT_ACCESS_HORIZON_S,
    DEFAULT_VALIDATION_FRACTION,
    access_samples,
)
from training.access_fit import AccessFitConfig, access_metadata, fit_access_model
from training.metrics import classification_metrics
from training.retrain import LogCandidate


@dataclass(frozen=True)
class RequestLogTrainer:
    """Trains and judges an access-only candidate on request log files (`retrain`'s hook)."""

    horizon_s: float = DEFAULT_ACCESS_HORIZON_S
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION
    fit: AccessFitConfig = field(default_factory=AccessFitConfig)

    @staticmethod
    def handles(paths: list[Path]) -> bool:
        """Whether every selected file is a request log (by its name)."""
        return bool(paths) and all(
            FILE_PATTERN.match(p.name.removesuffix(".gz")) is not None for p in paths
        )

    def train(self, paths: list[Path], current: Path | None) -> LogCandidate:
        with tempfile.TemporaryDirectory(prefix="lpc-retrain-logs-") as folder:
            for i, path in enumerate(paths):  # the selection only, read as one folder
                (Path(folder) / f"{i:05d}-{path.name}").symlink_to(path.resolve())
            trace = load_trace(
                folder, TraceOptions(horizon_s=self.horizon_s, max_model_len=TRACE_MAX_MODEL_LEN)
            )
        requests = trace.requests
        newest_day = max(FILE_PATTERN.match(p.name.removesuffix(".gz")).group(1) for p in paths)
        day_start_s = dt.datetime.fromisoformat(newest_day).replace(tzinfo=dt.UTC).timestamp()
        offset_s = day_start_s - requests[0].arrival_s
        # One day of logs only: judge on its second half instead.
        split = split_in_time(requests, offset_s if offset_s >= 1 else 0.5)
        table = request_table(requests, None)
        names = default_feature_names(list(table.columns))
        samples = access_samples(
            table, names, split.cut_s, self.horizon_s, self.validation_fraction
        )
        result = fit_access_model(samples, self.fit)
        fingerprint = hashlib.sha256(
            "\n".join(sorted(p.name for p in paths)).encode() + f":{split.cut_s}".encode()
        ).hexdigest()[:16]
        evaluation = {
            "evaluation_day": newest_day if offset_s >= 1 else None,
            "split": split.to_dict(),
            "horizon_s": self.horizon_s,
            "samples": result.metrics["samples"],
            "requests": len(requests),
            "engine_token_hit_ratio": trace.info["request_log"]["engine_token_hit_ratio"],
        }
        metadata = access_metadata(
            result, fingerprint, {"request_logs": [p.name for p in paths], **evaluation}
        )
        current_metrics, problem = None, None
        if current is not None:
            current_metrics, problem = _score_current(
                current, table, split.cut_s, self.horizon_s, self.validation_fraction
            )
        return LogCandidate(
            model=result.model,
            metadata=metadata,
            metrics=result.metrics.get("mlp", {}),
            evaluation_samples=int(samples.labels["evaluation"].size),
            current_metrics=current_metrics,
            current_problem=problem,
            data=evaluation,
        )


def _score_current(
    path: Path, table: Any, cut_s: float, horizon_s: float, validation_fraction: float
) -> tuple[dict[str, Any] | None, str | None]:
    """The current model's metrics on the candidate's evaluation samples, or why it has none
    (a text model: the logs hold no text)."""
    from predictor.access_predictor import AccessPredictor
    from predictor.artifact import ArtifactError

    try:
        current = AccessPredictor.load(path)
        samples = access_samples(
            table, current.feature_names, cut_s, horizon_s, validation_fraction
        )
    except (ArtifactError, OSError, ValueError) as error:
        return None, f"{type(error).__name__}: {error}"
    labels = samples.labels["evaluation"]
    if labels.size == 0 or labels.min() == labels.max():
        return {}, None
    probabilities = np.asarray(current.predict(samples.features["evaluation"]), dtype=np.float64)
    return classification_metrics(labels, probabilities).to_dict(), None
