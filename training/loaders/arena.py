"""Chatbot-Arena: `{"question_id", "conversation_a": [...], "conversation_b": [...], …}`.

Each record is one user's chat shown to two models side by side: the user prompts are the
same, the replies differ. Mode `a` (the default) yields `conversation_a` only, so every user
session counts once; mode `both` yields both. Ids are `<question_id>:a` and `<question_id>:b`
in either mode (an id always names the same conversation), and both share the group id
`<question_id>`, so the two sides of one question never straddle the train/evaluation split.
"""

from __future__ import annotations

from training.loaders.cleaning import RecordProblem, message_list, raw_messages, record_id
from training.loaders.readers import RecordPosition
from training.loaders.record_format import ParsedRecord, RecordFormat
from training.loaders.report import LoadReport

ARENA_SIDES = {"a": ("a",), "both": ("a", "b")}


def parse_arena_record(
    record: dict, position: RecordPosition, mode: str | None, report: LoadReport
) -> list[ParsedRecord]:
    """One conversation per side; a malformed side is reported without losing the other."""
    question_id = record_id(record, "question_id")
    sides = ARENA_SIDES[mode or "a"]
    parsed: list[ParsedRecord] = []
    for side in sides:
        key = f"conversation_{side}"
        conversation_id = f"{question_id}:{side}"
        try:
            pairs = raw_messages(message_list(record, key), "role", "content", report, key)
        except RecordProblem as problem:
            if len(sides) == 1:
                raise
            parsed.append(ParsedRecord(conversation_id, question_id, [], problem))
            continue
        parsed.append(ParsedRecord(conversation_id, question_id, pairs))
    if all(p.problem is not None for p in parsed):
        raise parsed[0].problem  # type: ignore[misc]
    return parsed


ARENA = RecordFormat(
    name="arena",
    record_keys=frozenset({"question_id", "conversation_a"}),
    modes=("a", "both"),
    columns=("question_id", "conversation_a", "conversation_b"),
    required_columns=("question_id", "conversation_a"),
    parse=parse_arena_record,
)
