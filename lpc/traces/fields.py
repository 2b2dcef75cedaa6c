"""Field checks shared by the trace importers: each failure names the file, line and field."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lpc.traces.jsonl import fail


def number(record: dict[str, Any], key: str, path: Path, lineno: int) -> float:
    """A finite number >= 0."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise fail(path, lineno, f"{key!r} must be a finite number, got {value!r}")
    if value < 0:
        raise fail(path, lineno, f"{key!r} must be >= 0, got {value!r}")
    return float(value)


# Replays hold times as float seconds. Below 2**42 s (about 139,000 years) a float still
# tells times a millisecond apart (its spacing there is 2**-10 s); beyond, a request's
# duration, or the gap between two requests, can round to nothing (a completion at its
# arrival) or to a jump of seconds, and the replay would be of another trace. No clock
# reads that much: such a time is in the wrong unit (nanoseconds) or corrupt.
MAX_TIME_S = 2.0**42


def time_value(record: dict[str, Any], key: str, path: Path, lineno: int, unit: str = "s") -> float:
    """A time in `unit` (s or ms): a finite number >= 0, below `MAX_TIME_S`."""
    value = number(record, key, path, lineno)
    if value / (1000 if unit == "ms" else 1) >= MAX_TIME_S:
        raise fail(
            path,
            lineno,
            f"{key!r} {value:g} {unit} is too large for a time: beyond 2**42 s (about "
            "139,000 years) a float no longer tells milliseconds apart",
        )
    return value


def count(record: dict[str, Any], key: str, path: Path, lineno: int, minimum: int = 0) -> int:
    """An int >= minimum."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise fail(path, lineno, f"{key!r} must be an int >= {minimum}, got {value!r}")
    return value


def hash_ids(
    record: dict[str, Any],
    path: Path,
    lineno: int,
    input_length: int,
    block_size: int,
    signed: bool = False,
    key: str = "hash_ids",
    length_name: str = "'input_length'",
) -> list[int]:
    """A non-empty list of ints (>= 0 unless `signed`: a 64-bit hash written as a signed
    integer is still just an identity), one per `block_size` tokens of the prompt (the last
    block may be partial); `sequence_hash_ids` cover prompt and output
    (`length_name` says which length `input_length` holds, for the message)."""
    value = record.get(key)
    if not isinstance(value, list) or not value:
        raise fail(path, lineno, f"{key!r} must be a non-empty list of ints, got {value!r}")
    for i, h in enumerate(value):
        if isinstance(h, bool) or not isinstance(h, int) or (h < 0 and not signed):
            kind = "an int" if signed else "an int >= 0"
            raise fail(path, lineno, f"{key}[{i}] must be {kind}, got {h!r}")
    expected = -(-input_length // block_size)
    if len(value) != expected:
        raise fail(
            path,
            lineno,
            f"{length_name} {input_length} needs {expected} blocks of {block_size} tokens, "
            f"but {key!r} has {len(value)}",
        )
    return value
