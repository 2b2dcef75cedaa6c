"""OpenAI-style chat: one object per line, `{"messages": [{"role", "content"}, …], "id"?}`.

`content` may be a string, null, or a list of parts (`{"type": "text", "text": …}`; other
part types are counted and ignored). The id is `id`, else `conversation_id`; without either, a
stable one is made from the record's line (or index) and a hash of its messages, e.g.
`line12-3f2a9c0b1d4e`: the same file gives the same ids on every run.
"""

from __future__ import annotations

import hashlib
import json

from training.loaders.cleaning import message_list, raw_messages, record_id
from training.loaders.readers import RecordPosition
from training.loaders.record_format import ParsedRecord, RecordFormat
from training.loaders.report import LoadReport

ID_KEYS = ("id", "conversation_id")


def generated_id(messages: list, position: RecordPosition) -> str:
    """`line<N>-<12 hex>` (or `record<N>-…` without line numbers), from content and place."""
    canonical = json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    place = f"line{position.line}" if position.line is not None else f"record{position.index}"
    return f"{place}-{digest}"


def parse_openai_record(
    record: dict, position: RecordPosition, mode: str | None, report: LoadReport
) -> list[ParsedRecord]:
    messages = message_list(record, "messages")
    pairs = raw_messages(messages, "role", "content", report, "messages")
    key = next((k for k in ID_KEYS if record.get(k) is not None), None)
    conversation_id = generated_id(messages, position) if key is None else record_id(record, key)
    return [ParsedRecord(conversation_id, None, pairs)]


OPENAI = RecordFormat(
    name="openai",
    record_keys=frozenset({"messages"}),
    modes=(None,),
    columns=("messages", "id", "conversation_id"),
    required_columns=("messages",),
    parse=parse_openai_record,
)
