"""Raw records from files: JSON Lines, one (possibly cut-off) JSON array, or Parquet.

Readers know nothing about chat formats; they yield each record's parsed JSON value with its
position (file, record index, line, byte offset), or the reason it could not be parsed, so
the pipeline can skip it or raise with a message a person can act on. A file cut off in the
middle of its last record is read up to the cut and the cut is recorded in the report.

Bytes that are not valid UTF-8 are replaced by U+FFFD (as `errors="replace"` would) and
counted per record, so one bad byte never costs a record.
"""

from __future__ import annotations

import bisect
import codecs
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from training.loaders.report import LoadReport, MalformedFileError

JSON_ARRAY = "json_array"
JSON_LINES = "jsonl"
PARQUET = "parquet"
LAYOUTS = (JSON_ARRAY, JSON_LINES, PARQUET)

DEFAULT_CHUNK_BYTES = 4 << 20
_PARQUET_MAGIC = b"PAR1"
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = "\ufeff"
_WHITESPACE = re.compile(r"[ \t\r\n]*")
_CUT_NUMBER_TAIL = re.compile(r"[-+.eE0-9]*")
_LITERALS = ("true", "false", "null")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class RecordPosition:
    """Where a record sits in its source: enough to find it with an editor or `dd`."""

    path: str
    index: int
    line: int | None = None
    byte_offset: int | None = None

    def describe(self) -> str:
        where = [f"record {self.index}"]
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.byte_offset is not None:
            where.append(f"byte {self.byte_offset}")
        return f"{self.path}: {', '.join(where)}"


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record as read: its JSON value, or `problem` saying why it could not be parsed."""

    position: RecordPosition
    value: object = None
    problem: str | None = None
    invalid_utf8_bytes: int = 0


def detect_layout(path: Path) -> str:
    """JSON array, JSON Lines or Parquet, from the first bytes (the name only breaks ties)."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(_PARQUET_MAGIC):
        return PARQUET
    if path.suffix == ".parquet":
        raise MalformedFileError(f"{path}: named .parquet but does not start with Parquet magic")
    if head.startswith(_GZIP_MAGIC):
        raise MalformedFileError(
            f"{path}: gzip-compressed; conversation files are read uncompressed "
            f"(gzip -dc {path} > {path.with_suffix('')})"
        )
    binary = _binary_evidence(head)
    if binary:
        raise MalformedFileError(
            f"{path}: not JSON Lines, a JSON array or Parquet ({binary}; starts with {head[:8]!r})"
        )
    text = head.decode("utf-8", errors="replace").lstrip(_BOM + " \t\r\n")
    if not text:
        raise MalformedFileError(f"{path}: the file is empty (or only whitespace)")
    if text[0] == "[":
        return JSON_ARRAY
    if text[0] == "{" or path.suffix.lower() in (".jsonl", ".ndjson"):
        return JSON_LINES  # a .jsonl file may start with a bad line: the reader reports it
    raise MalformedFileError(
        f"{path}: not JSON Lines, a JSON array or Parquet (starts with {text[:20]!r})"
    )


def _binary_evidence(head: bytes) -> str | None:
    """Why these first bytes are binary data rather than JSON text, or None when they may be text.

    JSON text never holds a NUL byte, and a dump with a few bad bytes (which the readers
    replace and count) is still mostly valid UTF-8; a PNG, a zip or a model file is not.
    """
    if b"\x00" in head:
        return "binary data: it holds NUL bytes"
    _, replacements = decode_utf8(head[:-4] if len(head) >= 4096 else head)  # a cut character
    invalid = sum(n for _, n in replacements)
    if invalid > max(8, len(head) // 16):
        return f"binary data: {invalid} of its first {len(head)} bytes are not UTF-8 text"
    return None


def decode_utf8(data: bytes | memoryview) -> tuple[str, list[tuple[int, int]]]:
    """Decode, replacing invalid bytes; also return (char index, bytes replaced) per U+FFFD."""
    decoder = Utf8Decoder()
    text = decoder.decode(data, final=True)
    return text, decoder.take_replacements()


class Utf8Decoder:
    """Incremental UTF-8 decoding that records where it replaced invalid bytes.

    A multi-byte character split between two chunks is carried over, not replaced.
    """

    def __init__(self) -> None:
        self._pending = b""
        self._replacements: list[tuple[int, int]] = []

    def decode(self, data: bytes | memoryview, final: bool = False) -> str:
        buffer = memoryview(self._pending + bytes(data)) if self._pending else memoryview(data)
        self._pending = b""
        parts: list[str] = []
        num_chars = 0
        start = 0
        while start < len(buffer):
            try:
                text, consumed = codecs.utf_8_decode(buffer[start:], "strict", final)
            except UnicodeDecodeError as error:
                good, _ = codecs.utf_8_decode(buffer[start : start + error.start], "strict", True)
                parts.append(good)
                num_chars += len(good)
                self._replacements.append((num_chars, error.end - error.start))
                parts.append("\ufffd")
                num_chars += 1
                start += error.end
                continue
            parts.append(text)
            num_chars += len(text)
            start += consumed
            if start < len(buffer):  # an incomplete character at the end: wait for the rest
                self._pending = bytes(buffer[start:])
            break
        return "".join(parts)

    def take_replacements(self) -> list[tuple[int, int]]:
        """(char index within the text of the last `decode` call, bytes replaced), then reset."""
        replacements, self._replacements = self._replacements, []
        return replacements


def looks_cut_off(error: json.JSONDecodeError, text: str) -> bool:
    """Whether a parse error is explained by the text simply ending too early."""
    if error.msg.startswith("Unterminated string"):
        return True  # no closing quote anywhere after it: the text ends inside the string
    tail = text[error.pos :].strip()
    if not tail:
        return True
    if error.msg.startswith("Invalid \\uXXXX escape"):
        return len(text) - error.pos <= 5
    if any(literal.startswith(tail) for literal in _LITERALS):
        return True
    return _CUT_NUMBER_TAIL.fullmatch(tail) is not None


def iter_jsonl_records(path: Path, report: LoadReport) -> Iterator[RawRecord]:
    """One record per non-blank line; a last line cut off mid-record is a truncation."""
    name = str(path)
    with open(path, "rb") as f:
        offset = 0
        index = 0
        for line_number, raw in enumerate(f, start=1):
            start = offset
            offset += len(raw)
            if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
                start += 3
                report.notes.append(f"{name}: UTF-8 byte order mark skipped")
            if not raw.strip():
                continue
            text, replacements = decode_utf8(raw)
            text = text.rstrip("\r\n")
            position = RecordPosition(name, index, line_number, start)
            index += 1
            try:
                value = json.loads(text)
            except json.JSONDecodeError as error:
                if not raw.endswith(b"\n") and looks_cut_off(error, text):
                    _record_truncation(report, start, len(raw))
                    return
                where = (
                    "at the end of the line"
                    if error.pos >= len(text)
                    else f"at column {error.pos + 1}"
                )
                yield RawRecord(
                    position,
                    problem=f"{error.msg} ({where})",
                    invalid_utf8_bytes=_replaced_bytes(replacements),
                )
                continue
            yield RawRecord(position, value, invalid_utf8_bytes=_replaced_bytes(replacements))


def iter_json_array_records(
    path: Path,
    report: LoadReport,
    is_record: Callable[[object], bool],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[RawRecord]:
    """The items of one top-level JSON array, read as a stream of complete items.

    Does not need the whole file to parse: a file cut off inside an item yields every item
    before the cut. After a malformed item it skips ahead to the next `{…}` that `is_record`
    accepts and that is followed by `,` or `]`, so the good items after it are kept.
    """
    with open(path, "rb") as f:
        yield from _JsonArrayScanner(path, f, report, is_record, chunk_bytes).records()


class _JsonArrayScanner:
    """A sliding text window over a JSON array file, with byte and line bookkeeping.

    Byte offsets and line numbers are found by walking a cursor forward over the window, so
    each character is counted once however many records are located.
    """

    def __init__(
        self,
        path: Path,
        file: BinaryIO,
        report: LoadReport,
        is_record: Callable[[object], bool],
        chunk_bytes: int,
    ) -> None:
        self.name = str(path)
        self.file = file
        self.file_size = path.stat().st_size
        self.report = report
        self.is_record = is_record
        self.chunk_bytes = chunk_bytes
        self.decoder = Utf8Decoder()
        self.buf = ""
        self.eof = False
        # U+FFFD we inserted in `buf`, as sorted char indices and the bytes each one replaced.
        self.replaced_at: list[int] = []
        self.replaced_bytes: list[int] = []
        # Line and byte offset of buf[0], and a cursor (char index, line, byte offset) in buf.
        self.buf_line = 1
        self.buf_byte = 0
        self.cursor = (0, 1, 0)

    def fill(self, min_bytes: int = 0) -> bool:
        """Append the next chunk (at least `min_bytes`) to the window; False at end of file."""
        if self.eof:
            return False
        data = self.file.read(max(self.chunk_bytes, min_bytes))
        final = not data
        text = self.decoder.decode(data, final=final)
        base = len(self.buf)
        for i, n in self.decoder.take_replacements():
            self.replaced_at.append(base + i)
            self.replaced_bytes.append(n)
        self.buf += text
        self.eof = final
        return bool(text) or not final

    def compact(self, upto: int) -> None:
        """Forget buf[:upto], keeping byte offsets and line numbers right."""
        line, byte = self.locate(upto)
        self.buf_line, self.buf_byte = line, byte
        self.cursor = (0, line, byte)
        keep = bisect.bisect_left(self.replaced_at, upto)
        self.replaced_at = [i - upto for i in self.replaced_at[keep:]]
        self.replaced_bytes = self.replaced_bytes[keep:]
        self.buf = self.buf[upto:]

    def locate(self, at: int) -> tuple[int, int]:
        """(line, byte offset) of buf[at]."""
        char, line, byte = self.cursor
        if at < char:  # behind the cursor (rare): count from the window start
            char, line, byte = 0, self.buf_line, self.buf_byte
        segment = self.buf[char:at]
        line += segment.count("\n")
        byte += len(segment) if segment.isascii() else len(segment.encode("utf-8", "surrogatepass"))
        lo = bisect.bisect_left(self.replaced_at, char)
        hi = bisect.bisect_left(self.replaced_at, at)
        byte += sum(self.replaced_bytes[lo:hi]) - 3 * (hi - lo)  # U+FFFD is 3 bytes in UTF-8
        self.cursor = (at, line, byte)
        return line, byte

    def position(self, index: int, at: int) -> RecordPosition:
        line, byte = self.locate(at)
        return RecordPosition(self.name, index, line, byte)

    def invalid_bytes_in(self, start: int, end: int) -> int:
        lo = bisect.bisect_left(self.replaced_at, start)
        hi = bisect.bisect_left(self.replaced_at, end)
        return sum(self.replaced_bytes[lo:hi])

    def skip_whitespace(self, at: int) -> int:
        """Index of the next non-whitespace char (reading more as needed), len(buf) at EOF."""
        while True:
            at = _WHITESPACE.match(self.buf, at).end()
            if at < len(self.buf) or not self.fill():
                return at

    def parse_at(self, at: int) -> tuple[object, int] | json.JSONDecodeError:
        """The JSON value starting at `at` and its end, reading more while it is incomplete."""
        while True:
            try:
                return _DECODER.raw_decode(self.buf, at)
            except json.JSONDecodeError as error:
                if looks_cut_off(error, self.buf) and self.fill(min_bytes=len(self.buf) - at):
                    continue  # grow geometrically so a huge item costs O(its size)
                return error

    def records(self) -> Iterator[RawRecord]:
        at = self.skip_whitespace(0)
        if self.buf.startswith(_BOM, at):
            self.report.notes.append(f"{self.name}: UTF-8 byte order mark skipped")
            at = self.skip_whitespace(at + 1)
        if not self.buf.startswith("[", at):
            raise MalformedFileError(f"{self.name}: expected a JSON array ('[') at the start")
        at += 1
        index = 0
        expect_separator = False
        while True:
            if at > self.chunk_bytes and at > len(self.buf) // 2:
                self.compact(at)
                at = 0
            at = self.skip_whitespace(at)
            if at < len(self.buf) and self.buf[at] == "]":
                self._check_trailing(at + 1)
                return
            if expect_separator and at < len(self.buf) and self.buf[at] == ",":
                at = self.skip_whitespace(at + 1)
                if at < len(self.buf) and self.buf[at] == "]":
                    self.report.notes.append(
                        f"{self.name}: a comma before the closing ']' was ignored"
                    )
                    self._check_trailing(at + 1)
                    return
            elif expect_separator and at < len(self.buf):
                yield RawRecord(
                    self.position(index, at),
                    problem=f"expected ',' or ']' after the previous record, found "
                    f"{self.buf[at]!r}",
                )
                index += 1
                resumed = self._resync(at)
                if resumed is None:
                    return
                at, expect_separator = resumed, False
                continue
            if at >= len(self.buf):
                self._truncated_at(at, "the array is not closed")
                return
            parsed = self.parse_at(at)
            if isinstance(parsed, json.JSONDecodeError):
                if looks_cut_off(parsed, self.buf):  # parse_at read on, so this is the end
                    self._truncated_at(at, "the last record is cut off")
                    return
                position = self.position(index, at)
                error_byte = self.locate(parsed.pos)[1]
                index += 1
                resumed = self._resync(at + 1)
                yield RawRecord(position, problem=f"{parsed.msg} (at byte {error_byte})")
                if resumed is None:
                    return
                at, expect_separator = resumed, False
                continue
            value, end = parsed
            yield RawRecord(
                self.position(index, at),
                value,
                invalid_utf8_bytes=self.invalid_bytes_in(at, end) if self.replaced_at else 0,
            )
            index += 1
            at, expect_separator = end, True

    def _resync(self, start: int) -> int | None:
        """Where the next good record starts after garbage (None if none is left).

        A candidate is a `{` whose JSON value parses, passes `is_record` and is followed by
        `,` or `]` (or the end of the file): the shape of an array item, not of a nested
        object inside one.
        """
        search = start
        while True:
            k = self.buf.find("{", search)
            if k < 0:
                search = len(self.buf)
                if self.fill():
                    continue
                self.report.notes.append(
                    f"{self.name}: no complete record after byte {self.locate(start)[1]}; "
                    "the rest of the file was ignored"
                )
                return None
            parsed = self.parse_at(k)
            search = k + 1
            if isinstance(parsed, json.JSONDecodeError) or not self.is_record(parsed[0]):
                continue
            after = self.skip_whitespace(parsed[1])
            if after >= len(self.buf) or self.buf[after] in ",]":
                return k

    def _truncated_at(self, at: int, why: str) -> None:
        offset = self.locate(at)[1]
        _record_truncation(self.report, offset, self.file_size - offset)
        self.report.notes.append(f"{self.name}: {why} (at byte {offset})")

    def _check_trailing(self, at: int) -> None:
        """Refuse anything but whitespace after the closing `]`, naming its byte: a second
        array (files joined with `cat`), a record (appended with `>>`) or other text would
        otherwise be lost with only a note, its records never read nor counted."""
        while self.fill():
            pass
        start = self.skip_whitespace(at)
        if start >= len(self.buf):
            return
        where = f"{self.name}: byte {self.locate(start)[1]}"
        if self.buf[start] == "[":
            raise MalformedFileError(
                f"{where}: a second JSON array after the first one's closing ']': were files "
                "joined with cat? pass the files separately (a folder of them)"
            )
        if self.buf[start] == "{":
            raise MalformedFileError(
                f"{where}: a JSON record after the array's closing ']', which would be lost: "
                "was it appended to the file? move it inside the array, or pass it as a "
                "separate JSON Lines file"
            )
        rest = self.buf[start:].rstrip()
        raise MalformedFileError(
            f"{where}: {len(rest)} characters after the array's closing ']' (starting "
            f"{rest[:20]!r}): not JSON this file can hold; remove them"
        )


def iter_parquet_records(
    path: Path, columns: tuple[str, ...], required: tuple[str, ...], batch_rows: int = 1024
) -> Iterator[RawRecord]:
    """Rows of a Parquet file as dicts, reading only `columns` (those present)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = str(path)
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as error:
        raise MalformedFileError(f"{name}: not a readable Parquet file ({error})") from error
    names = set(parquet.schema_arrow.names)
    missing = [column for column in required if column not in names]
    if missing:
        raise MalformedFileError(
            f"{name}: Parquet file has no column(s) {', '.join(missing)}; "
            f"it has: {', '.join(sorted(names))}"
        )
    index = 0
    try:
        for batch in parquet.iter_batches(
            batch_size=batch_rows, columns=[c for c in columns if c in names]
        ):
            for row in batch.to_pylist():
                yield RawRecord(RecordPosition(name, index), row)
                index += 1
    except (pa.ArrowException, OSError) as error:
        raise MalformedFileError(
            f"{name}: Parquet data unreadable after record {index} ({error})"
        ) from error


def parquet_column_names(path: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return list(pq.ParquetFile(path).schema_arrow.names)
    except (pa.ArrowException, OSError) as error:
        raise MalformedFileError(f"{path}: not a readable Parquet file ({error})") from error


def _record_truncation(report: LoadReport, offset: int, num_bytes: int) -> None:
    report.truncated_at_byte = offset
    report.truncated_bytes = num_bytes


def _replaced_bytes(replacements: list[tuple[int, int]]) -> int:
    return sum(n for _, n in replacements)
