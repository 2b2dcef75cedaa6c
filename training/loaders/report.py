"""What a load read, produced, cleaned and skipped, and the errors it raises.

Real chat dumps are messy; a loader may clean or skip, but never silently: every change is
counted in a `LoadReport`, so two runs over the same file can be compared number for number.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from predictor.errors import UserError
from training.conversation import Conversation

MAX_PROBLEM_EXAMPLES = 20


class SkipReason(StrEnum):
    """Why a record (or a conversation built from it) was not produced.

    The first five make a record *malformed*: `strict=True` raises on them. The others are
    cleaning decisions, counted in both modes.
    """

    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    INVALID_ID = "invalid_id"  # an id that is not Unicode text (a lone surrogate)
    EMPTY_CONVERSATION = "empty_conversation"
    NO_USER_MESSAGE = "no_user_message"
    DUPLICATE_ID = "duplicate_id"
    MESSAGE_TOO_LONG = "message_too_long"


MALFORMED_REASONS = frozenset(
    {
        SkipReason.INVALID_JSON,
        SkipReason.NOT_AN_OBJECT,
        SkipReason.MISSING_FIELD,
        SkipReason.WRONG_TYPE,
        SkipReason.INVALID_ID,
    }
)


class LoaderError(UserError):
    """Base class of the errors the conversation loaders raise."""


class MalformedRecordError(LoaderError, ValueError):
    """A record that does not fit its format (raised with `strict=True`, or when unrecoverable).

    The message names the file, the record index (0-based), the line and byte offset where
    known, and the problem.
    """

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


class MalformedFileError(LoaderError, ValueError):
    """A file that cannot be read as any supported layout (e.g. a corrupt Parquet file)."""


class UnknownFormatError(LoaderError, ValueError):
    """The format was not given and could not be recognised from the first record."""


class DatasetNotFoundError(LoaderError, FileNotFoundError):
    """A local dataset path that does not exist, or a folder with no data files in it."""


class EmptyDatasetError(LoaderError, ValueError):
    """A load that produced no usable conversation; the message says what it skipped and why."""


class DatasetUnavailableError(LoaderError, RuntimeError):
    """A hub dataset (`hf:<id>`) could not be loaded: offline, gated, or not found."""


@dataclass(slots=True)
class LoadReport:
    """Counts of everything a load did to the data.

    Record counts: `records_read` counts every complete record seen (good or malformed; a
    truncated tail is not a record), `conversations_produced` what came out, `skipped` the
    records or conversations not produced, by `SkipReason` value. Message counts: what the
    cleaning rules (see `training.loaders.cleaning`) dropped or merged. `truncated_at_byte` is
    the byte offset where the last, incomplete record starts (None when the file is complete).
    """

    source: str
    format: str
    mode: str | None = None
    records_read: int = 0
    conversations_produced: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    roles_seen: Counter[str] = field(default_factory=Counter)
    unknown_roles: Counter[str] = field(default_factory=Counter)
    messages_kept: int = 0
    empty_messages_dropped: int = 0
    leading_assistant_messages_dropped: int = 0
    late_system_messages_dropped: int = 0
    same_role_messages_merged: int = 0
    non_text_parts: Counter[str] = field(default_factory=Counter)
    invalid_utf8_bytes_replaced: int = 0
    records_with_invalid_utf8: int = 0
    lone_surrogates_replaced: int = 0
    truncated_at_byte: int | None = None
    truncated_bytes: int = 0
    segments_merged: int = 0
    conversations_with_segment_gaps: int = 0
    missing_segments: int = 0
    limit_reached: bool = False
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return self.truncated_at_byte is not None

    @property
    def records_skipped(self) -> int:
        return sum(self.skipped.values())

    @property
    def malformed_records(self) -> int:
        return sum(n for reason, n in self.skipped.items() if reason in MALFORMED_REASONS)

    def skip(self, reason: SkipReason, where: str | None = None, detail: str = "") -> None:
        """Count one skip; keep the first few malformed ones as readable examples."""
        self.skipped[reason.value] += 1
        if where is not None and len(self.problems) < MAX_PROBLEM_EXAMPLES:
            self.problems.append(f"{where}: {reason.value}: {detail}" if detail else where)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (counters become plain dicts)."""
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Counter):
                value = dict(value.most_common())
            elif isinstance(value, list):
                value = list(value)
            data[f.name] = value
        data["truncated"] = self.truncated
        return data

    def summary(self) -> str:
        """A few human-readable lines; zero counts are left out."""
        lines = [
            f"{self.source} ({self.format}{', ' + self.mode if self.mode else ''}): "
            f"{self.records_read} records read, {self.conversations_produced} conversations"
        ]
        if self.skipped:
            lines.append("skipped: " + _counts(self.skipped))
        cleaned = {
            "empty messages dropped": self.empty_messages_dropped,
            "leading assistant messages dropped": self.leading_assistant_messages_dropped,
            "late system messages dropped": self.late_system_messages_dropped,
            "same-role messages merged": self.same_role_messages_merged,
            "invalid UTF-8 bytes replaced": self.invalid_utf8_bytes_replaced,
            "lone surrogates replaced": self.lone_surrogates_replaced,
            "segments merged": self.segments_merged,
            "conversations with segment gaps": self.conversations_with_segment_gaps,
            "missing segments": self.missing_segments,
        }
        if any(cleaned.values()):
            lines.append("cleaned: " + ", ".join(f"{k} {v}" for k, v in cleaned.items() if v))
        if self.unknown_roles:
            lines.append("messages with unknown roles dropped: " + _counts(self.unknown_roles))
        if self.non_text_parts:
            lines.append("non-text content parts ignored: " + _counts(self.non_text_parts))
        if self.truncated:
            lines.append(
                f"truncated: the last record starts at byte {self.truncated_at_byte} and is "
                f"cut off ({self.truncated_bytes} bytes ignored)"
            )
        if self.limit_reached:
            lines.append("stopped at the requested limit")
        lines.extend(self.notes)
        return "\n".join(lines)


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{key} {n}" for key, n in counter.most_common())


@dataclass(slots=True)
class LoadResult:
    """The conversations a load produced, in file order, and the report of how."""

    conversations: list[Conversation]
    report: LoadReport

    def __len__(self) -> int:
        return len(self.conversations)

    def require_conversations(self) -> LoadResult:
        """This result, or `EmptyDatasetError` when the load produced no conversation: the
        message says, on one line, what was read and what was skipped, cleaned or cut, and
        where the first problem was."""
        if self.conversations:
            return self
        summary = "; ".join(self.report.summary().splitlines())
        first = f"; first problem: {self.report.problems[0]}" if self.report.problems else ""
        raise EmptyDatasetError(f"no usable conversations in {summary}{first}")
