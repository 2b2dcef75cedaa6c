"""Load any supported trace into the requests a replay needs.

Formats: `mooncake` (FAST'25, conversations inferred by prefix linkage), `bailian` (ATC'25,
conversations from chat ids) and `lpc` (the project's own, `lpc.traces.lpc_trace`). The format is
recognised from the first line unless given; gzip or plain from the magic bytes. The name
`mooncake` alone means the Mooncake conversation trace bundled with the package.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from lpc.integrations.request_log import LOG_SOURCE
from lpc.traces.bailian import BAILIAN_BLOCK_SIZE, looks_like_bailian, parse_bailian
from lpc.traces.expand import expand_requests
from lpc.traces.jsonl import TraceError, read_json_lines
from lpc.traces.linkage import DEFAULT_SHARED_FANOUT, link_by_prefix
from lpc.traces.lpc_trace import TRACE_FORMAT, MessageTokenizer, Trace, read_trace
from lpc.traces.mooncake import MOONCAKE_BLOCK_SIZE, looks_like_mooncake, parse_mooncake
from lpc.traces.timeline import (
    DEFAULT_HORIZON_S,
    complete,
    cut_to_max_model_len,
    horizon_labels,
)
from lpc.workload import LatencyModel, ScriptedTurn, WorkloadRequest

TRACE_FORMATS = ("mooncake", "bailian", "lpc")
BUNDLED_TRACES = {
    "mooncake": "mooncake/conversation_trace.jsonl.gz",
    "mooncake-synthetic": "mooncake/synthetic_trace.jsonl.gz",
}
DATA_DIR = Path(__file__).resolve().parent.parent / "data"


@dataclass(frozen=True)
class TraceOptions:
    format: str | None = None  # None: recognised from the first line
    latency: LatencyModel = field(default_factory=LatencyModel)
    horizon_s: float = DEFAULT_HORIZON_S
    max_model_len: int | None = None
    shared_fanout: int = DEFAULT_SHARED_FANOUT


@dataclass
class LoadedTrace:
    requests: list[WorkloadRequest]  # sorted by arrival
    logged_probabilities: list[float | None] | None
    format: str
    path: Path
    trace_block_size: int | None  # None: the project's token-id form
    # What the import found: skipped lines (`skipped_last_lines`, and the files they were
    # in, `cut_last_line_files`, when any), linkage, cuts, labels
    info: dict[str, Any]
    request_types: list[str] | None = None  # Bailian's `type` per request (access features)


def resolve_trace(spec: str | Path) -> Path:
    """A file path, a folder of `lpc` trace files (a request log), or the name of a bundled
    trace (`mooncake`)."""
    path = Path(spec)
    if not path.exists() and str(spec) in BUNDLED_TRACES:
        return DATA_DIR / BUNDLED_TRACES[str(spec)]
    if not path.is_file() and not path.is_dir():
        known = ", ".join(BUNDLED_TRACES)
        raise TraceError(f"{path}: no such trace file (bundled traces: {known})")
    return path


def detect_format(path: Path, record: dict[str, Any], lineno: int) -> str:
    if record.get("format") == TRACE_FORMAT or "conversation_id" in record:
        return "lpc"
    if looks_like_bailian(record):
        return "bailian"
    if looks_like_mooncake(record):
        return "mooncake"
    keys = ", ".join(sorted(record)) or "none"
    raise TraceError(
        f"{path}:{lineno}: unknown trace format (keys: {keys}); expected "
        f"{', '.join(TRACE_FORMATS)} (pass --trace-format)"
    )


def trace_format_of(spec: str | Path, given: str | None = None) -> str:
    """The format of a trace (`given`, or recognised from its first line)."""
    if given is not None:
        return given
    path = resolve_trace(spec)
    if path.is_dir():
        return "lpc"  # a folder is a request log (`load_trace`)
    lines = read_json_lines(path)
    if not lines.records:
        raise TraceError(f"{path}: the trace holds no requests")
    lineno, record = lines.records[0]
    return detect_format(path, record, lineno)


def load_trace(
    spec: str | Path, options: TraceOptions, tokenize: MessageTokenizer | None = None
) -> LoadedTrace:
    path = resolve_trace(spec)
    if path.is_dir():
        if options.format not in (None, "lpc"):
            raise TraceError(f"{path}: a folder is read as `lpc` trace files (a request log)")
        fmt, compressed = "lpc", False
    else:
        lines = read_json_lines(path)
        if not lines.records:
            raise TraceError(f"{path}: the trace holds no requests")
        fmt = options.format or detect_format(path, lines.records[0][1], lines.records[0][0])
        compressed = lines.compressed
    if fmt not in TRACE_FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; choose from {', '.join(TRACE_FORMATS)}")
    if fmt == "lpc":
        return loaded_lpc_trace(read_trace(path, tokenize), path, options, compressed)
    info: dict[str, Any] = {"format": fmt, "compressed": compressed}
    request_types: list[str] | None = None
    if fmt == "mooncake":
        table = parse_mooncake(path, lines)
        linkage = link_by_prefix(table["hash_ids"].tolist(), options.shared_fanout)
        line = table["line"].tolist()  # the table's rows are numbered 0, 1, … (its index)
        table["conversation_id"] = [f"c{line[i]}" for i in linkage.conversation]
        table["turn_index"] = linkage.turn_index
        table["parent_row"] = linkage.parent
        table["request_id"] = [f"line{n}" for n in table["line"]]
        info["linkage"] = linkage.stats()
        block_size = MOONCAKE_BLOCK_SIZE
    else:
        table, orphans = parse_bailian(path, lines)
        table["request_id"] = table["chat_id"].astype(str)
        info["orphans"] = orphans
        info["types"] = dict(Counter(table["type"]))
        request_types = [str(t) for t in table["type"]]
        block_size = BAILIAN_BLOCK_SIZE
    info["skipped_last_lines"] = lines.skipped_last_lines
    if lines.skipped_last_lines:
        info["cut_last_line_files"] = [str(path)]
    requests = imported_requests(table, block_size)
    logged = None
    info["time_origin_s"] = float(table["arrival_s"].min())
    requests = _cut_and_label(requests, options, info, completed=False)
    return LoadedTrace(requests, logged, fmt, path, block_size, info, request_types)


def loaded_lpc_trace(
    trace: Trace, path: Path, options: TraceOptions, compressed: bool = False
) -> LoadedTrace:
    """A parsed `lpc` trace (a file, or a folder's files merged) as a replay loads it; the
    daily job's files parsed one per task (`lpc.traces.files`) end here too."""
    info: dict[str, Any] = {"format": "lpc", "compressed": compressed}
    info["skipped_last_lines"] = trace.skipped_last_lines
    if trace.cut_files:
        info["cut_last_line_files"] = [str(p) for p in trace.cut_files]
    request_log = trace.header.get("source") == LOG_SOURCE
    if request_log:
        info["request_log"] = request_log_summary(trace)
    requests = trace.requests
    if request_log:  # a request log has the engine's own finish times; labels by horizon
        requests = _cut_and_label(requests, options, info, completed=True)
    elif options.max_model_len is not None:
        requests, cut = cut_to_max_model_len(requests, options.max_model_len)
        info["cut_to_max_model_len"] = cut
    return LoadedTrace(
        requests, trace.logged_probabilities, "lpc", path, trace.hash_block_size, info
    )


def _cut_and_label(
    requests: list[WorkloadRequest], options: TraceOptions, info: dict[str, Any], completed: bool
) -> list[WorkloadRequest]:
    """Requests cut to `max_model_len`, completed by the latency model unless `completed`,
    and labelled by the horizon; what was cut and labelled goes into `info`."""
    if options.max_model_len is not None:
        requests, cut = cut_to_max_model_len(requests, options.max_model_len)
        info["cut_to_max_model_len"] = cut
    if not completed:
        complete(requests, options.latency)
    labels = horizon_labels(requests, options.horizon_s)
    for request, label in zip(requests, labels.labels, strict=True):
        request.turn.has_next_turn = label
    info["horizon_s"] = options.horizon_s
    info["censored_labels"] = labels.censored
    info["continuing_labels"] = sum(labels.labels)
    return requests


def request_log_summary(trace: Trace) -> dict[str, Any]:
    """What the serving engine saw, from its own log: the hit ratio a faithful replay of the
    log reproduces (Σ cached tokens / Σ prompt tokens, every request)."""
    prompt = sum(r.turn.num_prompt_tokens for r in trace.requests)
    cached = sum(c or 0 for c in trace.logged_cached_tokens or [])
    return {
        "files": trace.header.get("files", 1),
        "requests": len(trace.requests),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "engine_token_hit_ratio": cached / prompt if prompt else 0.0,
        "key_fingerprint": trace.header.get("key_fingerprint"),
    }


def imported_requests(table: pd.DataFrame, trace_block_size: int) -> list[WorkloadRequest]:
    """Requests of an imported table (sorted by arrival), with arrivals from 0 and completion
    times still to be set."""
    tokens = expand_requests(
        table["hash_ids"].tolist(),
        table["input_length"].tolist(),
        table["output_length"].tolist(),
        trace_block_size,
    )
    origin = float(table["arrival_s"].min())
    requests = []
    for request_id, conv, turn_index, arrival, seq in zip(
        table["request_id"],
        table["conversation_id"],
        table["turn_index"],
        table["arrival_s"],
        tokens,
        strict=True,
    ):
        turn = ScriptedTurn(conv, int(turn_index), seq, seq.num_prompt_tokens, False)
        requests.append(WorkloadRequest(request_id, turn, float(arrival) - origin, float("nan")))
    return requests
