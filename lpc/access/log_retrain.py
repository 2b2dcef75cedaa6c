"""The daily job on trace files: an access-only candidate, judged on a time-ordered split.

`lpc retrain --logs DIR` hands the files it selected here when they are trace files
(`lpc.traces.files`: Mooncake, Bailian or the project's JSONL, the serving plugin's request
logs included), read as one trace (`load_trace_files`). They hold no text, so the candidate is
an access-only model, as `lpc train --trace` trains it, fitted before a time-ordered cut (the
newest UTC day, else the last half; `split_at` overrides both) and judged with the current
model after it. The candidate carries its split on (`SplitHandoff`), so the job's
return-time model (`training.return_retrain`) trains and is judged on the same parts.

The split, its refusals, the labels and the judgement: docs/training.md, "6. Registry and the
daily job" (**Trace files.**).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lpc.access.training import check_validation_slice
from lpc.errors import UserError
from lpc.replay.ab_options import TRACE_MAX_MODEL_LEN
from lpc.replay.request_table import request_table
from lpc.traces.files import (
    json_lines_problem,
    load_lpc_files_apart,
    load_trace_files,
    trace_format_by_content,
)
from lpc.traces.load import LoadedTrace, TraceOptions
from lpc.traces.timeline import (
    DAY_S,
    DEFAULT_SPLIT_AT,
    TimeSplit,
    arrival_after_gap,
    split_in_time,
)
from predictor.access_features import default_feature_names
from training.access_data import (
    DEFAULT_ACCESS_HORIZON_S,
    DEFAULT_VALIDATION_FRACTION,
    access_samples,
)
from training.access_fit import AccessFitConfig, access_metadata, fit_access_model
from training.metrics import classification_metrics
from training.retrain import AccessCandidate
from training.return_retrain import SplitHandoff

if TYPE_CHECKING:
    from lpc.fleet.fanout import Executor

# Epoch seconds from 2000-01-01 UTC on are absolute times: no relative trace (ms or seconds
# from its own start) runs for thirty years.
ABSOLUTE_TIMES_FROM_S = 946_684_800.0


class MixedLogsError(UserError):
    """A logs folder holding files the job cannot train on together."""


def trace_format_of_files(paths: list[Path]) -> str | None:
    """The trace format shared by every file, None when none is a trace file; a mix of
    conversation and trace files, or of trace formats, raises naming one file of each. Among
    trace files, an empty file or one that is not JSON Lines (a picture saved as `.jsonl`)
    is neither kind: the error names it and says what it is."""
    formats = {path: trace_format_by_content(path) for path in paths}
    traces = {p: f for p, f in formats.items() if f is not None}
    if not traces:
        gzipped = next((p for p in paths if p.name.endswith(".gz")), None)
        if gzipped is not None:
            raise MixedLogsError(
                f"{gzipped}: a gzip file that is not a trace (Mooncake, Bailian or the "
                "project's JSONL); conversation logs are read uncompressed"
            )
        return None
    if len(traces) < len(paths):
        others = [p for p, f in formats.items() if f is None]
        trace, fmt = next(iter(traces.items()))
        for other in others:  # no log of either kind: say what is wrong with it instead
            problem = json_lines_problem(other)
            if problem is not None:
                raise MixedLogsError(
                    f"{other}: {problem} (the other files of --logs are trace files, e.g. "
                    f"{trace}, a {fmt} trace)"
                )
        conversation = others[0]
        raise MixedLogsError(
            f"--logs mixes conversation files and trace files (e.g. {conversation} and "
            f"{trace}, a {fmt} trace): give each kind a folder of its own"
        )
    by_format = {f: p for p, f in traces.items()}
    if len(by_format) > 1:
        examples = ", ".join(f"{p} ({f})" for f, p in sorted(by_format.items()))
        raise MixedLogsError(
            f"--logs mixes trace formats ({examples}): one folder holds one format"
        )
    return next(iter(by_format))


@dataclass(frozen=True)
class EvaluationSplit:
    """Where the trace is cut, and by which rule (reported with the outcome)."""

    split: TimeSplit
    rule: str
    evaluation_day: str | None  # the UTC day judged on, when the rule is the newest day
    absolute_times: bool


class ThinEvaluationError(UserError):
    """The evaluation part (the newest UTC day, or the span's last part) holds too few
    requests to judge a model on."""


def time_ordered_split(
    trace: LoadedTrace, split_at: float | None, min_evaluation_requests: int = 1
) -> EvaluationSplit:
    """The cut between training and evaluation part (the module docstring's rule). Unless
    `split_at` gives the cut, the evaluation part must hold `min_evaluation_requests`, else
    `ThinEvaluationError` says how many it holds and how far its first lies from the request
    before it: one request stamped days ahead would otherwise be the whole newest day (or,
    on relative times, move the half-way cut past the rest of the data), and stretch the
    training part over an empty gap, whose validation slice then holds nothing."""
    requests = trace.requests
    origin_s = float(trace.info.get("time_origin_s", 0.0))  # imported traces start at 0
    first_s = origin_s + requests[0].arrival_s
    last_s = origin_s + requests[-1].arrival_s
    absolute = first_s >= ABSOLUTE_TIMES_FROM_S
    if split_at is not None:  # the operator's own cut: judged as it falls
        return EvaluationSplit(
            split_in_time(requests, split_at), f"--split-at {split_at:g}", None, absolute
        )
    chosen: EvaluationSplit | None = None
    if absolute:
        day_start_s = (last_s // DAY_S) * DAY_S
        if day_start_s - first_s >= 1:
            day = dt.datetime.fromtimestamp(day_start_s, dt.UTC).strftime("%Y-%m-%d")
            split = split_in_time(requests, day_start_s - first_s)
            chosen = EvaluationSplit(split, "newest UTC day", day, absolute)
    if chosen is None:
        rule = f"last {1 - DEFAULT_SPLIT_AT:.0%} of the span in time" + (
            " (a single UTC day)" if absolute else " (relative times)"
        )
        chosen = EvaluationSplit(split_in_time(requests, DEFAULT_SPLIT_AT), rule, None, absolute)
    if chosen.split.eval_requests < min_evaluation_requests:
        raise _thin_evaluation(trace, chosen, min_evaluation_requests)
    return chosen


def _thin_evaluation(
    trace: LoadedTrace, chosen: EvaluationSplit, minimum: int
) -> ThinEvaluationError:
    """The refusal of an evaluation part too thin to judge on, saying what it holds."""
    split = chosen.split
    count = split.eval_requests
    part = (
        f"the newest UTC day, {chosen.evaluation_day},"
        if chosen.evaluation_day is not None
        else f"the evaluation part ({chosen.rule})"
    )
    where = f"the first, {arrival_after_gap(trace.requests, split.first_eval)}"
    remedy = "A clock ahead? Remove those requests, "
    if chosen.evaluation_day is not None:
        remedy += "run the job later in that day, "
    remedy += "or pass --split-at"
    return ThinEvaluationError(
        f"{part} holds only {count} request{'s' if count != 1 else ''} ({where}): fewer "
        f"than --min-eval-samples {minimum} to judge a model on. {remedy}"
    )


@dataclass(frozen=True)
class TraceLogTrainer:
    """Trains and judges an access-only candidate on trace files (`retrain`'s hook)."""

    horizon_s: float = DEFAULT_ACCESS_HORIZON_S
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION
    split_at: float | None = None  # None: the module docstring's rule
    fit: AccessFitConfig = field(default_factory=AccessFitConfig)
    # The evaluation part must hold this many requests (`lpc retrain --min-eval-samples`)
    min_evaluation_requests: int = 200
    # Where the files are parsed: None or serial here; Ray (`lpc retrain --ray`): one task
    # per file of the project's JSONL (request logs), the same trace (`load_lpc_files_apart`)
    executor: Executor | None = None
    log: Callable[[str], None] | None = field(default=None, compare=False)

    @staticmethod
    def handles(paths: list[Path]) -> bool:
        """Whether the selected files are trace files (by content; a mix raises)."""
        return bool(paths) and trace_format_of_files(paths) is not None

    def train(self, paths: list[Path], current: Path | None) -> AccessCandidate:
        fmt = trace_format_of_files(paths)
        assert fmt is not None, "train() is called only when handles() said yes"
        trace, table, read = self._read(paths, fmt)
        chosen = time_ordered_split(trace, self.split_at, self.min_evaluation_requests)
        split = chosen.split
        names = default_feature_names(list(table.columns))
        samples = access_samples(
            table, names, split.cut_s, self.horizon_s, self.validation_fraction
        )
        check_validation_slice(trace, split, samples, self.validation_fraction)
        result = fit_access_model(samples, self.fit)
        fingerprint = hashlib.sha256(
            "\n".join(sorted(p.name for p in paths)).encode() + f":{split.cut_s}".encode()
        ).hexdigest()[:16]
        evaluation: dict[str, Any] = {
            "trace_format": fmt,
            "trace_files": len(paths),
            "split_rule": chosen.rule,
            "absolute_times": chosen.absolute_times,
            "evaluation_day": chosen.evaluation_day,
            "split": split.to_dict(),
            "horizon_s": self.horizon_s,
            "samples": result.metrics["samples"],
            "requests": len(trace.requests),
            "skipped_last_lines": trace.info.get("skipped_last_lines", 0),
        }
        if "request_log" in trace.info:
            evaluation["engine_token_hit_ratio"] = trace.info["request_log"][
                "engine_token_hit_ratio"
            ]
        metadata = access_metadata(
            result, fingerprint, {"trace_files": [p.name for p in paths], **evaluation}
        )
        current_metrics, problem = None, None
        if current is not None:
            current_metrics, problem = _score_current(
                current, table, split.cut_s, self.horizon_s, self.validation_fraction
            )
        return AccessCandidate(
            model=result.model,
            metadata=metadata,
            metrics=result.metrics.get("mlp", {}),
            evaluation_samples=int(samples.labels["evaluation"].size),
            current_metrics=current_metrics,
            current_problem=problem,
            data={**evaluation, "read": read},
            handoff=SplitHandoff(
                table,
                tuple(names),
                split.cut_s,
                self.validation_fraction,
                {
                    "trace_files": [p.name for p in paths],
                    "trace_format": fmt,
                    "split_rule": chosen.rule,
                    "split": split.to_dict(),
                },
            ),
        )

    def _read(self, paths: list[Path], fmt: str) -> tuple[LoadedTrace, Any, dict[str, Any]]:
        """The files as one trace and its request table, and how they were read (for the
        report; not part of the model's metadata, which is the same either way)."""
        options = TraceOptions(horizon_s=self.horizon_s, max_model_len=TRACE_MAX_MODEL_LEN)
        started = time.perf_counter()
        executor = self.executor
        if executor is None or executor.kind == "serial" or fmt != "lpc":
            if executor is not None and executor.kind == "ray" and self.log is not None:
                self.log(f"logs: {fmt} files are read serially (Ray reads request logs)")
            trace = load_trace_files(paths, fmt, options)
            table = request_table(trace.requests, trace.request_types)
            return trace, table, {"on": "serial", "seconds": _since(started)}
        from lpc.fleet.fanout import RayMapper
        from lpc.fleet.request_logs import (
            TABLE_TASKS_PER_WORKER,
            conversation_groups,
            request_table_apart,
        )

        mapper = RayMapper(executor, _progress(self.log, "log files parsed"))
        trace = load_lpc_files_apart(paths, options, mapper)
        parsed_s = _since(started)
        groups = conversation_groups(trace.requests, TABLE_TASKS_PER_WORKER * executor.workers)
        mapper.on_item = _progress(self.log, "request-table groups built")
        table = request_table_apart(trace.requests, groups, mapper)
        return (
            trace,
            table,
            {
                "on": "ray",
                "address": executor.address,
                "workers": executor.workers if executor.address is None else None,
                "file_tasks": len(paths),
                "table_tasks": len(groups),
                "parse_seconds": parsed_s,
                "seconds": _since(started),
                "task_cpu_s": round(mapper.task_cpu_s, 3),
                "worker_peak_bytes": dict(sorted(mapper.worker_peak_bytes.items())),
            },
        )


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)


def _progress(log: Callable[[str], None] | None, what: str) -> Callable[[int, int], None]:
    """`done/total <what>` about ten times over a run of tasks (nothing without a log)."""

    def report(done: int, total: int) -> None:
        if log is not None and (done % max(1, total // 10) == 0 or done == total):
            log(f"logs: {done}/{total} {what} on Ray")

    return report


def _score_current(
    path: Path, table: Any, cut_s: float, horizon_s: float, validation_fraction: float
) -> tuple[dict[str, Any] | None, str | None]:
    """The current model's metrics on the candidate's evaluation samples, or why it has none
    (a text model: traces hold no text; an access feature the trace cannot feed)."""
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
