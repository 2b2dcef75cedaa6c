"""JSON Lines reading shared by every trace format: gzip or plain, and a cut last line.

A log that is still being written, or was cut by a crash, ends in half a line. That line is
skipped and counted (the caller reports the count); a broken line anywhere else is an error
naming the file and line. So is a line that is not Unicode text: JSON's `\\ud800` escape
decodes to half a UTF-16 pair, which no file, log or table can store, so a replay that
accepted it would fail later, far from the line, when it writes the string out.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lpc.errors import UserError

GZIP_MAGIC = b"\x1f\x8b"
# A line that may decode to a lone surrogate: a \uD800-\uDFFF escape, or those code points
# as UTF-8-like bytes (which `json.loads` passes through); a valid pair matches too, then the
# decoded record is searched, which finds none.
_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class TraceError(UserError, ValueError):
    """A trace file that cannot be replayed; the message names the file, line and field."""


def fail(path: Path | str, lineno: int, message: str) -> TraceError:
    return TraceError(f"{path}:{lineno}: {message}")


@dataclass(frozen=True)
class JsonLines:
    """The JSON objects of a file, with their line numbers (1-based)."""

    records: list[tuple[int, dict[str, Any]]]
    skipped_last_lines: int  # 1 when the last line was cut mid-record, else 0
    compressed: bool


def read_bytes(path: Path) -> tuple[bytes, bool]:
    """The file's content, decompressed when it starts with the gzip magic bytes.

    Every member of a multi-member gzip file is read, as `gzip -dc` does: logs compressed
    one by one and joined (`cat a.gz b.gz`, `gzip -c >>`) are one file of all their lines.
    Zero bytes after the last member (padding) are ignored, as gzip ignores them; any other
    bytes there are an error naming their offset, never dropped in silence. A gzip stream cut
    short (a copy interrupted, a log rotated mid-write) yields what was decompressed before
    the cut; the half line at its end is then skipped like any cut line.
    """
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    raw = path.read_bytes()
    if not raw.startswith(GZIP_MAGIC):
        return raw, False
    return _gunzip_members(path, raw), True


def _gunzip_members(path: Path, raw: bytes) -> bytes:
    """All members' data, one after the other (see `read_bytes`)."""
    chunks: list[bytes] = []
    start = 0  # byte offset of the member being read
    member = 1
    while True:
        decompressor = zlib.decompressobj(wbits=31)
        try:
            chunks.append(decompressor.decompress(raw[start:]))
        except zlib.error as error:
            raise TraceError(
                f"{path}: not a readable gzip file (member {member} at byte {start}: {error})"
            ) from None
        if not decompressor.eof:
            return b"".join(chunks)  # cut short: its half last line is skipped and counted
        rest = decompressor.unused_data
        if not rest.strip(b"\0"):
            return b"".join(chunks)
        start = len(raw) - len(rest)
        if not rest.startswith(GZIP_MAGIC):
            raise TraceError(
                f"{path}: byte {start}: {len(rest)} bytes after the end of gzip member "
                f"{member} are not gzip data (trailing garbage, which `gzip -dc` would drop "
                "with a warning); cut the file at that byte or recompress it"
            )
        member += 1


def first_record(path: Path) -> tuple[int, dict[str, Any]] | None:
    """The first JSON object of the file (for recognising its format), or None."""
    lines = read_json_lines(path)
    return lines.records[0] if lines.records else None


def read_json_lines(path: Path) -> JsonLines:
    data, compressed = read_bytes(path)
    lines = data.split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records: list[tuple[int, dict[str, Any]]] = []
    skipped = 0
    for index, raw in enumerate(lines):
        if not raw.strip():
            continue
        lineno = index + 1
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            if index == last:
                skipped += 1
                continue
            raise fail(path, lineno, f"not valid JSON ({error})") from None
        if not isinstance(record, dict):
            raise fail(path, lineno, "each line must be a JSON object")
        hint = (b"\\u" in raw or b"\xed" in raw) and _SURROGATE_HINT.search(raw)  # `in`: fast
        problem = not_unicode(record) if hint else None
        if problem is not None:
            raise fail(path, lineno, problem)
        records.append((lineno, record))
    return JsonLines(records, skipped, compressed)


def not_unicode(value: Any, where: str = "") -> str | None:
    """Why a decoded JSON value is not Unicode text, naming the first key or string that
    holds a lone surrogate; None when it is text throughout."""
    if isinstance(value, str):
        match = _SURROGATE.search(value)
        if match is None:
            return None
        return (
            f"'{where}' is not valid Unicode: a lone surrogate \\u{ord(match.group()):04x} "
            f"at character {match.start()} (half of a UTF-16 pair)"
        )
    children: list[tuple[Any, str]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            children.append((key, f"{where} key" if where else "key"))
            children.append((item, f"{where}.{key}" if where else str(key)))
    elif isinstance(value, list):
        children = [(item, f"{where}[{i}]") for i, item in enumerate(value)]
    for child, at in children:
        problem = not_unicode(child, at)
        if problem is not None:
            return problem
    return None


def gzip_bytes(data: bytes) -> bytes:
    """Deterministic gzip (no file name, time 0), so a bundled file is reproducible."""
    return gzip.compress(data, compresslevel=9, mtime=0)
