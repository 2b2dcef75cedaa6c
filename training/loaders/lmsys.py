"""LMSys-Chat-1M: `{"conversation_id": …, "conversation": [{"role", "content"}, …], …}`.

Other fields (model, language, moderation flags) are ignored. Available as Parquet on the hub
(`hf:lmsys/lmsys-chat-1m`, gated) and as JSON Lines or JSON arrays locally.
"""

from __future__ import annotations

from training.loaders.cleaning import message_list, raw_messages, record_id
from training.loaders.readers import RecordPosition
from training.loaders.record_format import ParsedRecord, RecordFormat
from training.loaders.report import LoadReport


def parse_lmsys_record(
    record: dict, position: RecordPosition, mode: str | None, report: LoadReport
) -> list[ParsedRecord]:
    conversation_id = record_id(record, "conversation_id")
    messages = message_list(record, "conversation")
    return [
        ParsedRecord(
            conversation_id, None, raw_messages(messages, "role", "content", report, "conversation")
        )
    ]


LMSYS = RecordFormat(
    name="lmsys",
    record_keys=frozenset({"conversation_id", "conversation"}),
    modes=(None,),
    columns=("conversation_id", "conversation"),
    required_columns=("conversation_id", "conversation"),
    parse=parse_lmsys_record,
)
