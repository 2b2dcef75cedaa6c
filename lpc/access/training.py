"""`lpc train --trace`: an access-only model from a request trace, end to end.

Load the trace as `lpc ab --trace` does (same import, linkage, latency model and time split,
so the model trains on exactly the training part the A/B warms its cache with), build the
request table, label with a censored horizon, fit, score on the evaluation part, and write
the artifact.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lpc.replay.ab_options import TRACE_MAX_MODEL_LEN
from lpc.replay.request_table import request_table
from lpc.traces.linkage import DEFAULT_SHARED_FANOUT
from lpc.traces.load import LoadedTrace
from lpc.traces.timeline import DEFAULT_SPLIT_AT, TimeSplit, arrival_after_gap
from predictor.access_features import check_names, default_feature_names
from predictor.atomic_files import OutputWriteError
from predictor.errors import InvalidInputError
from training.access_data import (
    DEFAULT_ACCESS_HORIZON_S,
    DEFAULT_VALIDATION_FRACTION,
    AccessSamples,
    access_samples,
)
from training.access_fit import AccessFitConfig, fit_access_model, save_access_model


@dataclass(frozen=True)
class TraceTrainOptions:
    trace: str | Path = "mooncake"
    trace_format: str | None = None
    split_at: float = DEFAULT_SPLIT_AT
    horizon_s: float = DEFAULT_ACCESS_HORIZON_S
    shared_fanout: int = DEFAULT_SHARED_FANOUT
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION
    features: tuple[str, ...] | None = None  # None: every feature the trace can feed
    fit: AccessFitConfig = field(default_factory=AccessFitConfig)


def check_validation_slice(
    trace: LoadedTrace, split: TimeSplit, samples: AccessSamples, validation_fraction: float
) -> None:
    """`InvalidInputError` naming the real cause when the validation slice holds no request.

    The slice is the training part's last share of its time span, so it is empty only when a
    gap swallows it, and the request after the gap is the evaluation part's first. One request
    stamped days ahead is the usual cause: `--split-at`'s fraction of the span then cuts in
    the empty days, leaving that request alone in the evaluation part, and no horizon helps.
    The refusal says how many requests the slice and the evaluation part hold and how long
    the gap is, in the daily job's words (`arrival_after_gap`)."""
    parts = samples.parts
    if parts.validation != parts.evaluation or split.first_eval == 0:
        return  # a slice with requests, or no training part at all (fit_access_model says)
    start_s = split.start_s
    count = split.eval_requests
    raise InvalidInputError(
        "no usable samples: the validation slice of the training part holds no request (its "
        f"last {validation_fraction:.0%} in time, {parts.validation_cut_s - start_s:,.0f} s to "
        f"{parts.evaluation_cut_s - start_s:,.0f} s after the first arrival): the next, "
        f"{arrival_after_gap(trace.requests, split.first_eval)}, and begins an evaluation "
        f"part of {count} request{'s' if count != 1 else ''}. A clock ahead? Remove those "
        "requests, or pass --split-at in seconds; a gap in the traffic? another --split-at "
        "or --validation-share"
    )


def train_on_trace(options: TraceTrainOptions, out: Path | None) -> dict[str, Any]:
    """Train, score and (with `out`) save; returns the report (`--json` prints it)."""
    from lpc.traces.load import TraceOptions, load_trace
    from lpc.traces.timeline import split_in_time

    started = time.perf_counter()
    trace = load_trace(
        options.trace,
        TraceOptions(
            options.trace_format,
            horizon_s=options.horizon_s,
            max_model_len=TRACE_MAX_MODEL_LEN,
            shared_fanout=options.shared_fanout,
        ),
    )
    split = split_in_time(trace.requests, options.split_at)
    table = request_table(trace.requests, trace.request_types)
    loaded_s = time.perf_counter() - started
    # unknown names, and names a table or an engine cannot compute, fail here by name
    names = check_names(
        options.features or default_feature_names(list(table.columns)),
        "--access-features",
        "table",
        "state",
    )
    samples = access_samples(
        table, names, split.cut_s, options.horizon_s, options.validation_fraction
    )
    check_validation_slice(trace, split, samples, options.validation_fraction)
    result = fit_access_model(samples, options.fit)
    fingerprint = hashlib.sha256(
        f"{trace.path.name}:{len(trace.requests)}:{split.cut_s}:{options.horizon_s}".encode()
    ).hexdigest()[:16]
    report: dict[str, Any] = {
        "trace": str(options.trace),
        "format": trace.format,
        "requests": len(trace.requests),
        "split": split.to_dict(),
        "horizon_s": options.horizon_s,
        "features": list(names),
        "hidden_sizes": list(options.fit.hidden_sizes),
        "ensemble": options.fit.ensemble,
        "refit": options.fit.refit,
        "teacher_share": options.fit.teacher_share,
        "metrics": {
            k: result.metrics[k] for k in ("mlp", "gbm", "turns_only") if k in result.metrics
        },
        "validation": result.metrics["validation"],
        "samples": result.metrics["samples"],
        "epochs": result.epochs,
        "member_epochs": result.metrics["member_epochs"],
        "served": result.served,
        "notes": result.notes,
    }
    if out is not None:
        notes = {
            "trace": str(options.trace),
            "split": split.to_dict(),
            "validation_fraction": options.validation_fraction,
            "references": {k: result.metrics.get(k) for k in ("gbm", "turns_only")},
        }
        try:
            save_access_model(out, result, fingerprint, notes)
            report["out"] = str(out)
        except OutputWriteError as error:  # the figures stay: the caller prints them
            report["write_error"] = str(error)
    report["timings_s"] = {
        "load_s": round(loaded_s, 3),
        "fit_s": round(result.fit_seconds, 3),
        "total_s": round(time.perf_counter() - started, 3),
    }
    return report
