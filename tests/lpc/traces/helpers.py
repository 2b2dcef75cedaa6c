"""Small traces for the importer tests: slices of the bundled Mooncake trace and writers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from lpc.traces.load import BUNDLED_TRACES, DATA_DIR


def bundled_lines(name: str = "mooncake") -> list[str]:
    with gzip.open(DATA_DIR / BUNDLED_TRACES[name], "rt") as handle:
        return [line for line in handle.read().split("\n") if line.strip()]


def write_lines(path: Path, records: list[dict | str], compress: bool = False) -> Path:
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)
    path.write_bytes(gzip.compress(text.encode()) if compress else text.encode())
    return path


def mooncake_record(
    timestamp_ms: float, ids: list[int], input_length: int | None = None, output_length: int = 10
) -> dict:
    if input_length is None:
        input_length = 512 * (len(ids) - 1) + 100
    return {
        "timestamp": timestamp_ms,
        "input_length": input_length,
        "output_length": output_length,
        "hash_ids": ids,
    }


def direct_infinite_hit_ratio(records: list[dict], block_size: int = 512) -> float:
    """Hit ratio of an infinite cache straight from the hash ids: a request hits the leading
    full blocks whose ids an earlier request already held as full blocks (at most
    input_length - 1 tokens, like vLLM)."""
    seen: set[int] = set()
    hit = queried = 0
    for r in records:
        ids, length = r["hash_ids"], r["input_length"]
        k = 0
        while k < (length - 1) // block_size and ids[k] in seen:
            k += 1
        hit += k * block_size
        queried += length
        seen.update(ids[: length // block_size])
    return hit / queried
