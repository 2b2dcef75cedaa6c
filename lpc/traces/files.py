"""Several trace files read as one trace: the daily job's folder of logs.

A file is a trace file by its content (its first line: Mooncake, Bailian or the project's JSON
lines; gzip or plain by the magic bytes), not by its name; one folder holds one format, and
every error names the file and line it was found in, never a temporary copy. How each format's
files combine: docs/training.md, "6. Registry and the daily job" (*Files of one format are
read as one trace*). The project's JSONL can also be read with its files parsed apart
(`map_files`, `parse_lpc_file`: one call per file, e.g. a Ray task each), giving the serial
read's requests: docs/design.md, "The fleet" (**The daily job on a fleet's logs**).
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lpc.traces.bailian import looks_like_bailian
from lpc.traces.jsonl import GZIP_MAGIC, TraceError, read_json_lines
from lpc.traces.load import LoadedTrace, TraceOptions, load_trace, loaded_lpc_trace
from lpc.traces.lpc_trace import (
    TRACE_FORMAT,
    Trace,
    _check_header,
    _hash_block_size,
    _joined_logs,
    _Line,
    _parse_line,
    _requests,
    fail,
)
from lpc.traces.mooncake import looks_like_mooncake

LPC_TRACE_KEYS = frozenset({"arrival_s", "completion_s"})


def trace_format_by_content(path: Path) -> str | None:
    """`mooncake`, `bailian` or `lpc` when the file's first line is a request (or header) of
    that trace format; None for anything else (a conversation file, or no JSON Lines at
    all: `json_lines_problem` says which)."""
    record, _ = _first_record(path)
    if not isinstance(record, dict):
        return None
    if record.get("format") == TRACE_FORMAT or record.keys() >= LPC_TRACE_KEYS:
        return "lpc"
    if looks_like_bailian(record):
        return "bailian"
    if looks_like_mooncake(record):
        return "mooncake"
    return None


def json_lines_problem(path: Path) -> str | None:
    """Why a file is no JSON Lines file at all, so neither a trace nor a conversation log in
    that form (it is empty, or its first line is not a JSON object), or None."""
    record, problem = _first_record(path)
    if problem is None and record is not None and not isinstance(record, dict):
        return "not JSON Lines: its first line is not a JSON object"
    return problem


def _first_record(path: Path) -> tuple[Any, str | None]:
    """The JSON value of the file's first line (gzip or plain), or None and why there is
    none; (None, None) for a JSON document or a table (conversation loaders' formats)."""
    if path.suffix.lower() in (".json", ".parquet"):
        return None, None
    try:
        with path.open("rb") as raw:
            compressed = raw.read(2) == GZIP_MAGIC
        opener = gzip.open if compressed else open
        with opener(path, "rb") as handle:
            line = next((line for line in handle if line.strip()), b"")
    except (OSError, EOFError, zlib.error) as error:
        return None, f"cannot be read ({error})"
    if not line:
        return None, "the file is empty"
    try:
        return json.loads(line), None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, "not JSON Lines: its first line is not JSON"


@dataclass(frozen=True)
class ParsedLpcFile:
    """One file of the project's JSONL, its lines read and checked (`parse_lpc_file`)."""

    lines: list[_Line]
    cut_last_line: bool


# (function of the shared block size and a file, block size, files) -> results in file order
FileMapper = Callable[
    [Callable[[int | None, Path], ParsedLpcFile], int | None, Sequence[Path]],
    list[ParsedLpcFile],
]


def parse_lpc_file(block_size: int | None, path: Path) -> ParsedLpcFile:
    """A file's request lines checked on their own, as `read_trace` checks them; a header
    anywhere but the first line is refused as there (logs joined with cat). `block_size` is
    the trace's (`lpc_headers`), since a file without a header takes the first file's."""
    read = read_json_lines(path)
    lines = []
    for index, (lineno, record) in enumerate(read.records):
        if record.get("format") == TRACE_FORMAT:
            if index > 0:
                raise _joined_logs(path, lineno, read.records[0])
            continue
        lines.append(_parse_line(path, lineno, record, block_size, None))
    return ParsedLpcFile(lines, bool(read.skipped_last_lines))


def lpc_headers(paths: Sequence[Path]) -> dict[str, Any]:
    """The trace's header from the files' first lines, checked as `read_trace` checks a
    folder's: every header agrees with the first on block size and key, and no file goes
    without one beside keyed logs."""
    header: dict[str, Any] = {}
    header_file: Path | None = None
    headerless: list[tuple[Path, int]] = []
    for path in paths:
        lineno, record = _first_numbered_record(path)
        if not isinstance(record, dict):
            continue  # an empty file; a broken first line is the file's parse error
        if record.get("format") != TRACE_FORMAT:
            headerless.append((path, lineno))
            continue
        _check_header(path, lineno, record, header, header_file)
        if header_file is None:
            header, header_file = dict(record), path
    if headerless and header.get("key_fingerprint") is not None:
        path, lineno = headerless[0]
        raise fail(
            path,
            lineno,
            f"no header, while {header_file}'s names 'key_fingerprint' "
            f"{header['key_fingerprint']!r}: the key of this file's ids cannot be checked (a "
            "request log starts with its header; was it cut or joined by hand?)",
        )
    if len(paths) > 1:
        header["files"] = len(paths)
    return header


def _first_numbered_record(path: Path) -> tuple[int, Any]:
    """The first non-blank line's number and JSON value ((0, None) for an empty file or a
    first line that is not JSON: the file's own read reports it)."""
    with path.open("rb") as raw:
        compressed = raw.read(2) == GZIP_MAGIC
    opener = gzip.open if compressed else open
    with opener(path, "rb") as handle:
        for lineno, line in enumerate(handle, 1):
            if line.strip():
                try:
                    return lineno, json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    return 0, None
    return 0, None


def load_lpc_files_apart(
    paths: Sequence[Path], options: TraceOptions, map_files: FileMapper
) -> LoadedTrace:
    """The project's JSONL files as one trace, each file parsed by `map_files` (docs/design.md,
    "The fleet"); equal to `load_trace_files(paths, "lpc", options)`."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise TraceError("no trace files given")
    header = lpc_headers(paths)
    block_size = _hash_block_size(paths[0], header)
    parsed = map_files(parse_lpc_file, block_size, paths)
    keyed = [
        ((line.arrival, index, line.arrival_order, line.lineno), line)
        for index, part in enumerate(parsed)
        for line in part.lines
    ]
    if not keyed:
        raise TraceError(f"{paths[-1].parent}: the trace holds no requests")
    keyed.sort(key=lambda item: item[0])  # `_Line.sort_key`, the files by their given order
    lines = [line for _, line in keyed]
    del keyed
    cut_files = tuple(p for p, part in zip(paths, parsed, strict=True) if part.cut_last_line)
    probabilities = [line.probability for line in lines]
    cached = [line.cached_tokens for line in lines]
    trace = Trace(
        _requests(lines, block_size),
        header,
        probabilities if any(p is not None for p in probabilities) else None,
        block_size,
        len(cut_files),
        cached if any(c is not None for c in cached) else None,
        cut_files,
    )
    if len(paths) == 1:  # as `load_trace` reads one file: the file, gzip or not
        with paths[0].open("rb") as raw:
            compressed = raw.read(2) == GZIP_MAGIC
        loaded = loaded_lpc_trace(trace, paths[0], options, compressed)
    else:  # as `load_trace` reads a folder, then named by the files' own
        loaded = loaded_lpc_trace(trace, paths[-1].parent, options)
    loaded.info["files"] = len(paths)
    return loaded


def load_trace_files(
    paths: Sequence[Path], trace_format: str, options: TraceOptions
) -> LoadedTrace:
    """The files (oldest first, all of `trace_format`) as one trace; see the module
    docstring for how each format's files are combined."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise TraceError("no trace files given")
    options = replace(options, format=trace_format)
    if len(paths) == 1:
        trace = load_trace(paths[0], options)
        trace.info["files"] = 1
        return trace
    with tempfile.TemporaryDirectory(prefix="lpc-trace-files-") as folder:
        if trace_format == "lpc":
            links = {}
            for i, path in enumerate(paths):  # the given files only, read as one folder
                link = Path(folder) / f"{i:05d}-{path.name}"
                link.symlink_to(path.resolve())
                links[str(link)] = path
            trace = _with_real_names(lambda: load_trace(folder, options), links)
            if "cut_last_line_files" in trace.info:
                trace.info["cut_last_line_files"] = [
                    str(links.get(p, p)) for p in trace.info["cut_last_line_files"]
                ]
        else:
            combined = Path(folder) / "combined.jsonl"
            origin, cut_files = _concatenate(paths, trace_format, combined)
            trace = _with_real_names(
                lambda: load_trace(combined, options), {}, str(combined), origin
            )
            trace.info["skipped_last_lines"] = len(cut_files)
            if cut_files:
                trace.info["cut_last_line_files"] = [str(p) for p in cut_files]
    trace.info["files"] = len(paths)
    trace.path = paths[-1].parent
    return trace


def _concatenate(
    paths: list[Path], trace_format: str, out: Path
) -> tuple[dict[int, tuple[Path, int]], list[Path]]:
    """Write the files' records into one JSONL file; return where each of its lines came from
    (for error messages) and the files whose cut last line was skipped."""
    origin: dict[int, tuple[Path, int]] = {}
    cut_files: list[Path] = []
    previous: tuple[Path, int, float] | None = None  # file, line, timestamp of the last record
    chats: dict[Any, tuple[Path, int]] = {}
    with out.open("w", encoding="utf-8") as handle:
        for path in paths:
            lines = read_json_lines(path)  # a broken line raises with this file's name
            if lines.skipped_last_lines:
                cut_files.append(path)
            for lineno, record in lines.records:
                if trace_format == "mooncake":
                    previous = _check_one_clock(path, lineno, record, previous)
                elif "chat_id" in record:
                    chat = record["chat_id"]
                    if isinstance(chat, int | str) and chat in chats:
                        first_path, first_line = chats[chat]
                        raise TraceError(
                            f"{path}:{lineno}: 'chat_id' {chat!r} already appeared in "
                            f"{first_path}:{first_line}"
                        )
                    if isinstance(chat, int | str):
                        chats[chat] = (path, lineno)
                handle.write(json.dumps(record) + "\n")
                origin[len(origin) + 1] = (path, lineno)
    return origin, cut_files


def _check_one_clock(
    path: Path, lineno: int, record: dict, previous: tuple[Path, int, float] | None
) -> tuple[Path, int, float] | None:
    timestamp = record.get("timestamp")
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
        return previous  # the Mooncake parser names the bad field
    if previous is not None and previous[0] != path and timestamp < previous[2]:
        raise TraceError(
            f"{path}:{lineno}: 'timestamp' {timestamp} is before {previous[0]}'s last "
            f"{previous[2]:g} (line {previous[1]}): Mooncake files of one folder are read as "
            "one trace on one clock, in date order; a file whose clock starts again is "
            "another trace (give it a folder of its own)"
        )
    return path, lineno, float(timestamp)


_LOCATION = re.compile(r"(?P<path>\S+?):(?P<line>\d+):")


def _with_real_names(
    load: Callable[[], LoadedTrace],
    links: dict[str, Path],
    combined: str | None = None,
    origin: dict[int, tuple[Path, int]] | None = None,
) -> LoadedTrace:
    """Run `load`, rewriting a temporary file's name (and line) in its error to the real
    file's: `links` maps a symbolic link to its file, `origin` a line of the `combined`
    file to the file and line it was copied from."""
    try:
        return load()
    except TraceError as error:
        message = str(error)
        for link, path in links.items():
            message = message.replace(link, str(path))
        if combined is not None and origin is not None:

            def real(match: re.Match) -> str:
                where = origin.get(int(match["line"]))
                if match["path"] != combined or where is None:
                    return match.group(0)
                return f"{where[0]}:{where[1]}:"

            message = _LOCATION.sub(real, message).replace(combined, "the files read as one trace")
        raise TraceError(message) from None
