"""Mooncake traces (kvcache-ai/Mooncake, FAST'25): arrivals, lengths and 512-token block ids.

Each line: `{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}`, in arrival
order. `hash_ids` are remapped hashes of the prompt's 512-token prefix blocks (equal id =
equal prefix up to and including that block); there are no conversation ids, so conversations
are inferred by prefix linkage (`lpc.traces.linkage`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lpc.traces.fields import count, hash_ids, time_value
from lpc.traces.jsonl import JsonLines, fail

MOONCAKE_BLOCK_SIZE = 512
MOONCAKE_KEYS = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})


def looks_like_mooncake(record: dict) -> bool:
    return record.keys() >= MOONCAKE_KEYS and "chat_id" not in record


def parse_mooncake(path: Path, lines: JsonLines) -> pd.DataFrame:
    """One row per request, in file order: line, arrival_s, input/output length, hash_ids."""
    rows = []
    previous_ms = -1.0
    for lineno, record in lines.records:
        timestamp_ms = time_value(record, "timestamp", path, lineno, unit="ms")
        if timestamp_ms < previous_ms:
            raise fail(
                path,
                lineno,
                f"'timestamp' {record['timestamp']} is before the previous line's "
                f"{previous_ms:g}: a Mooncake trace lists requests in arrival order (a "
                "clock that starts again: traces joined with cat? give each a file of its own)",
            )
        previous_ms = timestamp_ms
        input_length = count(record, "input_length", path, lineno, minimum=1)
        output_length = count(record, "output_length", path, lineno)
        ids = hash_ids(record, path, lineno, input_length, MOONCAKE_BLOCK_SIZE)
        rows.append((lineno, timestamp_ms / 1000.0, input_length, output_length, ids))
    return pd.DataFrame(
        rows, columns=["line", "arrival_s", "input_length", "output_length", "hash_ids"]
    )
