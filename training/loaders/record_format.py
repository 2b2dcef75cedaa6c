"""The contract between the loading pipeline and one chat data format.

A format turns one raw record into (raw role, text) pairs under an id; the pipeline does the
rest (cleaning, skipping, counting, strict errors) the same way for every format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from predictor.errors import InvalidInputError
from training.loaders.cleaning import RecordProblem
from training.loaders.readers import RecordPosition
from training.loaders.report import LoadReport


@dataclass(frozen=True, slots=True)
class ParsedRecord:
    """A conversation as the data holds it, before cleaning.

    `problem` is set when this conversation of a record is malformed while another one of the
    same record is fine (Chatbot-Arena's two sides): the good one is not lost.
    """

    conversation_id: str
    group_id: str | None
    pairs: list[tuple[str, str]]
    problem: RecordProblem | None = None


ParseRecord = Callable[[dict, RecordPosition, "str | None", LoadReport], list[ParsedRecord]]
CombineRecords = Callable[
    [Iterable[ParsedRecord], "str | None", LoadReport], Iterable[ParsedRecord]
]


@dataclass(frozen=True, slots=True)
class RecordFormat:
    """One chat data format.

    `record_keys` are the keys whose presence identifies a record of this format (used to
    recognise a file's format and to find the next record after a malformed one). `modes`
    lists the accepted `mode` values, the first being the default (None: the format has none).
    `columns` are the Parquet columns to read (`required_columns` must exist). `parse` may
    raise `RecordProblem`; `combine`, when set, regroups parsed records (ShareGPT's merge).
    """

    name: str
    record_keys: frozenset[str]
    modes: tuple[str | None, ...]
    columns: tuple[str, ...]
    required_columns: tuple[str, ...]
    parse: ParseRecord
    combine: CombineRecords | None = None

    def is_record(self, value: object) -> bool:
        return isinstance(value, dict) and self.record_keys <= value.keys()

    def resolve_mode(self, mode: str | None) -> str | None:
        if mode is None:
            return self.modes[0]
        if mode not in self.modes:
            allowed = ", ".join(repr(m) for m in self.modes if m is not None) or "none"
            raise InvalidInputError(f"format {self.name!r} accepts mode {allowed}; got {mode!r}")
        return mode
