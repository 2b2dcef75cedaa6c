"""A fleet's request logs: written from a trace (one file per instance and UTC day), and
their request table built per group of conversations (the daily job on Ray).

The daily job (`lpc retrain --logs`) reads what the serving plugin writes
(`lpc.integrations.request_log`): the project's JSONL with a `request-log` header, one file
per process and day. A fleet's logs are many such files; this writes them from any loaded
trace (e.g. the bundled Mooncake hour scaled to a fleet, `lpc.fleet.scale`), so the daily
job can be run and timed on a fleet's traffic. Each request goes to its conversation's home
instance (`routers.session_home`: session-sticky routing without rebalancing) and to the file
of its arrival's UTC day. Times become epoch seconds from `start_epoch_s`; a line keeps the
trace's block ids (`hash_ids`, the header's `hash_block_size` the trace's block size), its
lengths, conversation and request id, and its completion time, which the reader takes as
the engine's. Each file is written atomically (a temporary file, then a rename).

Reading them apart (`lpc retrain --ray`, `lpc.access.log_retrain`): after the files are parsed
one per task and merged (`lpc.traces.files.load_lpc_files_apart`), the request table, whose
columns read only a request's own conversation, is built per group of whole conversations,
one task each, and its rows put back in arrival order. This module stays light (no torch),
so a Ray worker that builds a table imports little.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lpc.errors import InvalidInputError
from lpc.fleet.routers import session_home
from lpc.integrations.request_log import LOG_SOURCE
from lpc.replay.request_table import request_table
from lpc.traces.expand import SyntheticTokens
from lpc.traces.lpc_trace import TRACE_FORMAT, TRACE_VERSION
from lpc.workload import WorkloadRequest


def log_file_name(day: str, instance: int) -> str:
    """The plugin's file name pattern, the instance in place of the process id."""
    return f"requests-{day}-pid{instance}-000.jsonl"


def _line(request: WorkloadRequest, start_epoch_s: float) -> str:
    tokens = request.turn.token_ids
    assert isinstance(tokens, SyntheticTokens), "checked by write_request_logs"
    record = {
        "request_id": request.request_id,
        "conversation_id": request.turn.conversation_id,
        "arrival_s": round(start_epoch_s + request.arrival_s, 6),
        "completion_s": round(start_epoch_s + request.completion_s, 6),
        "input_length": tokens.num_prompt_tokens,
        "output_length": tokens.num_output_tokens,
        "hash_ids": tokens.block_ids.tolist(),
    }
    return json.dumps(record, separators=(",", ":"))


def write_request_logs(
    requests: Sequence[WorkloadRequest], folder: Path, instances: int, start_epoch_s: float
) -> list[Path]:
    """Write the requests (in arrival order, block-hash form) as request-log files under
    `folder` (module docstring); returns the files written, by name."""
    if instances < 1:
        raise InvalidInputError(f"instances must be >= 1, got {instances}")
    if not requests:
        raise InvalidInputError("no requests to write")
    sizes = {
        r.turn.token_ids.trace_block_size
        for r in requests
        if isinstance(r.turn.token_ids, SyntheticTokens)
    }
    if len(sizes) != 1 or any(not isinstance(r.turn.token_ids, SyntheticTokens) for r in requests):
        raise InvalidInputError(
            "request logs are written from a block-hash trace of one block size (Mooncake, "
            "Bailian or the project's hash form)"
        )
    block_size = sizes.pop()
    shards: dict[tuple[str, int], list[str]] = {}
    for request in requests:
        epoch_s = start_epoch_s + request.arrival_s
        day = dt.datetime.fromtimestamp(epoch_s, dt.UTC).strftime("%Y-%m-%d")
        instance = session_home(request.turn.conversation_id, instances)
        shards.setdefault((day, instance), []).append(_line(request, start_epoch_s))
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for (day, instance), lines in sorted(shards.items()):
        header = {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            "source": LOG_SOURCE,
            "hash_block_size": block_size,
            "pid": instance,
            "day_utc": day,
            "text_recorded": False,
        }
        path = folder / log_file_name(day, instance)
        _write_atomic(path, json.dumps(header) + "\n" + "\n".join(lines) + "\n")
        written.append(path)
    return written


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's file is owner-only; logs are read by other jobs
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# Request-table tasks per (local) worker: enough to even out groups of unequal cost.
TABLE_TASKS_PER_WORKER = 4


def conversation_groups(requests: Sequence[WorkloadRequest], groups: int) -> list[list[int]]:
    """Row positions (in arrival order) split into at most `groups` groups of whole
    conversations, conversations dealt out by first arrival: a conversation's features read
    only its own earlier requests, so each group's request table is its rows' of the whole."""
    index: dict[str, int] = {}
    rows: list[list[int]] = [[] for _ in range(max(1, groups))]
    for row, request in enumerate(requests):
        group = index.setdefault(request.turn.conversation_id, len(index) % len(rows))
        rows[group].append(row)
    return [r for r in rows if r]


def _table_of_group(_: None, requests: list[WorkloadRequest]) -> pd.DataFrame:
    """One group's request table (a Ray task)."""
    return request_table(requests)


def request_table_apart(
    requests: Sequence[WorkloadRequest], groups: list[list[int]], mapper: Callable[..., list[Any]]
) -> pd.DataFrame:
    """`request_table(requests)` built per group of conversations by `mapper` (one call per
    group, `lpc.fleet.fanout.RayMapper`), the rows put back in arrival order: the same
    table, since a row's columns read its own conversation only (`conversation_groups`)."""
    parts = mapper(_table_of_group, None, [[requests[i] for i in group] for group in groups])
    table = pd.concat(parts, ignore_index=True)
    table.index = np.concatenate([np.asarray(g, dtype=np.int64) for g in groups])
    return table.sort_index().reset_index(drop=True)
