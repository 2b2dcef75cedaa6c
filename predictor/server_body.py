"""Reading a request body as JSON within bounds: its size, its nesting, its syntax.

Python's `json` parser recurses once per nesting level, so a body of ten thousand `[`
exhausts the interpreter's stack (a `RecursionError`, which used to escape as a 500 with a
traceback) long before it approaches the size limit. The nesting depth is therefore measured
on the raw bytes before parsing, with a handful of vectorised numpy passes (no Python loop
over the bytes, so a body at the size limit costs milliseconds): brackets inside JSON strings
do not count, which takes telling quotes that close a string from escaped ones.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from fastapi import Request

from predictor.rpc_schema import RequestLimits
from predictor.server_errors import BodyTooLarge, invalid_body

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN_SQUARE, _OPEN_CURLY = ord("["), ord("{")
_CLOSE_SQUARE, _CLOSE_CURLY = ord("]"), ord("}")
# Every byte that is not a quote, a backslash or a bracket becomes 0 (bytes.translate is C).
_STRUCTURE_ONLY = bytes(b if b in b'"\\[]{}' else 0 for b in range(256))
SCAN_CHUNK_BYTES = 1 << 20


def first_too_deep(body: bytes | bytearray, max_depth: int) -> int | None:
    """Byte offset of the first bracket that opens level `max_depth + 1` (outside strings),
    or None when the body never nests deeper than `max_depth`.

    Exact for valid JSON and for any prefix of it, which is all a parser reads before it
    fails, so a body it passes cannot make the parser recurse deeper than `max_depth`. Only
    quotes, backslashes and brackets are looked at (prompt text is mostly neither), chunk by
    chunk of `SCAN_CHUNK_BYTES`, carrying the depth, whether a string is open and the run of
    backslashes at the chunk's end."""
    depth, inside, backslashes = 0, False, 0
    for start in range(0, len(body), SCAN_CHUNK_BYTES):
        chunk = bytes(body[start : start + SCAN_CHUNK_BYTES]).translate(_STRUCTURE_ONLY)
        where = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8))
        if where.size == 0:
            backslashes = 0
            continue
        kind = np.frombuffer(chunk, dtype=np.uint8)[where]
        order = np.arange(where.size)
        slash = kind == _BACKSLASH
        # Backslash runs: a backslash continues the run of the byte right before it.
        adjacent = np.empty(where.size, dtype=bool)
        adjacent[0] = where[0] == 0
        adjacent[1:] = np.diff(where) == 1
        continues = slash & adjacent & np.concatenate(([False], slash[:-1]))
        run_start = np.maximum.accumulate(np.where(slash & ~continues, order, -1))
        run = np.where(slash, order - run_start + 1, 0)
        if backslashes:  # the run left open by the previous chunk
            carried = slash & (run_start == 0) & (where[0] == 0)
            run = np.where(carried, run + backslashes, run)
        # A quote is escaped when an odd number of backslashes runs right before it.
        quote = kind == _QUOTE
        run_before = np.zeros(where.size, dtype=np.int64)
        run_before[1:] = np.where(adjacent[1:], run[:-1], 0)
        if where[0] == 0:
            run_before[0] = backslashes
        real_quote = quote & (run_before % 2 == 0)
        # From an opening quote to its closing one, we are inside a string.
        in_string = (np.cumsum(real_quote) + inside) % 2 == 1
        steps = ((kind == _OPEN_SQUARE) | (kind == _OPEN_CURLY)).astype(np.int64) - (
            (kind == _CLOSE_SQUARE) | (kind == _CLOSE_CURLY)
        )
        steps[in_string] = 0
        levels = np.cumsum(steps) + depth
        too_deep = np.flatnonzero(levels > max_depth)
        if too_deep.size:
            return start + int(where[too_deep[0]])
        depth, inside = int(levels[-1]), bool(in_string[-1])
        ends_chunk = slash[-1] and where[-1] == len(chunk) - 1
        backslashes = int(run[-1]) if ends_chunk else 0
    return None


async def read_json_body(request: Request, limits: RequestLimits) -> Any:
    """The parsed body; raises `BodyTooLarge` (413) past `max_body_bytes` (without holding
    more than that in memory) and `InvalidRequest` (422) for a body nested deeper than
    `max_json_depth` or that is not JSON (an integer of more than 4300 digits included: Python
    refuses to convert it, `sys.get_int_max_str_digits`)."""
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"body of {declared} bytes exceeds the {limit}-byte limit")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(f"body exceeds the {limit}-byte limit")
    offset = first_too_deep(body, limits.max_json_depth)
    if offset is not None:
        raise invalid_body(
            f"body nests JSON deeper than {limits.max_json_depth} levels "
            f"(byte {offset} opens level {limits.max_json_depth + 1})",
            "json_too_deep",
        )
    try:
        return json.loads(body)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, an integer too long
        raise invalid_body(f"body is not valid JSON: {error}", "json_invalid") from None
