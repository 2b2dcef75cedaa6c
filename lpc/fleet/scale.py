"""A fleet's traffic from one instance's trace: k copies merged, each its own set of users.

Copy j of a Mooncake-format trace (0 ≤ j < k) keeps every request's lengths and prefix
structure, and changes two things:
- its block ids are offset by j × (the largest id + 1): copies share no block, so no copy's
  conversations or shared prompts hit another's cache (a fleet of k independent tenants; the
  original's own sharing stays inside each copy), and prefix linkage finds each copy's
  conversations as fresh ones (the request and conversation ids follow the merged lines);
- its timestamps are shifted by round(j × g / k) ms, g the original's mean gap between
  arrivals: the merged trace runs k times the rate over the same hour, the copies interleaved
  instead of arriving in lock-step.
Lines are merged by (timestamp, copy, original line). One copy is the original, line for line.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

from lpc.errors import InvalidInputError
from lpc.traces.jsonl import read_json_lines
from lpc.traces.load import resolve_trace
from lpc.traces.mooncake import looks_like_mooncake


def copy_shift_ms(copy: int, copies: int, mean_gap_ms: float) -> int:
    """Copy `copy`'s shift of its timestamps (module docstring)."""
    return round(copy * mean_gap_ms / copies)


def scaled_records(source: str | Path, copies: int) -> list[dict]:
    """The merged records of `copies` copies of a Mooncake-format trace (module docstring)."""
    if copies < 1:
        raise InvalidInputError(f"copies must be >= 1, got {copies}")
    path = resolve_trace(source)
    if path.is_dir():
        raise InvalidInputError(f"{path}: a fleet is scaled from one Mooncake-format file")
    records = [record for _, record in read_json_lines(path).records]
    if not records:
        raise InvalidInputError(f"{path}: the trace holds no requests")
    for lineno, record in enumerate(records, 1):
        if not looks_like_mooncake(record):
            raise InvalidInputError(
                f"{path}:{lineno}: not a Mooncake record (timestamp, input_length, "
                "output_length, hash_ids); a fleet is scaled from a Mooncake-format trace"
            )
    if copies == 1:
        return records
    stride = max((max(r["hash_ids"], default=-1) for r in records), default=-1) + 1
    times = [float(r["timestamp"]) for r in records]
    mean_gap_ms = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
    keyed = []
    for copy in range(copies):
        shift = copy_shift_ms(copy, copies, mean_gap_ms)
        offset = copy * stride
        for line, record in enumerate(records):
            moved = {
                **record,
                "timestamp": record["timestamp"] + shift,
                "hash_ids": [h + offset for h in record["hash_ids"]],
            }
            keyed.append(((moved["timestamp"], copy, line), moved))
    keyed.sort(key=lambda item: item[0])
    return [record for _, record in keyed]


def write_scaled_trace(source: str | Path, copies: int, out: Path) -> Path:
    """Write the merged trace (gzip JSONL) atomically: a temporary file, then a rename."""
    records = scaled_records(source, copies)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            for record in records:
                gz.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
