"""Alibaba Bailian traces (alibaba-edu/qwen-bailian-usagetraces-anon, ATC'25).

Each line: `chat_id`, `parent_chat_id` (-1 for a conversation's first request), `timestamp`
(seconds), `input_length`, `output_length`, `type` (text, search, image or file), `turn`
(1-based) and `hash_ids` (SipHash of 16-token blocks). Lines may come in any order; the
conversation of a request is the root of its parent chain.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lpc.traces.fields import count, hash_ids, time_value
from lpc.traces.jsonl import JsonLines, fail

BAILIAN_BLOCK_SIZE = 16
BAILIAN_TYPES = ("text", "search", "image", "file")
BAILIAN_KEYS = frozenset({"chat_id", "parent_chat_id", "timestamp", "hash_ids"})


def looks_like_bailian(record: dict) -> bool:
    return record.keys() >= BAILIAN_KEYS


def _chat_id(record: dict, key: str, path: Path, lineno: int) -> int | str:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
        raise fail(path, lineno, f"{key!r} must be an int or a non-empty string, got {value!r}")
    return value


def parse_bailian(path: Path, lines: JsonLines) -> tuple[pd.DataFrame, int]:
    """Rows sorted by arrival with `conversation_id`, `turn_index` and `parent_row` set from
    the ids; also the number of requests whose parent is not in the trace (each then starts
    a conversation of its own: a sampled trace cuts chains)."""
    rows = []
    line_of: dict[int | str, int] = {}
    for lineno, record in lines.records:
        chat = _chat_id(record, "chat_id", path, lineno)
        parent = _chat_id(record, "parent_chat_id", path, lineno)
        if chat in line_of:
            raise fail(path, lineno, f"'chat_id' {chat!r} already appeared on line {line_of[chat]}")
        line_of[chat] = lineno
        if parent == chat:
            raise fail(path, lineno, f"'parent_chat_id' {parent!r} is the request itself")
        timestamp = time_value(record, "timestamp", path, lineno)
        input_length = count(record, "input_length", path, lineno, minimum=1)
        output_length = count(record, "output_length", path, lineno)
        kind = record.get("type")
        if kind not in BAILIAN_TYPES:
            raise fail(
                path, lineno, f"'type' must be one of {', '.join(BAILIAN_TYPES)}, got {kind!r}"
            )
        turn = count(record, "turn", path, lineno, minimum=1)
        ids = hash_ids(record, path, lineno, input_length, BAILIAN_BLOCK_SIZE, signed=True)
        rows.append((lineno, timestamp, input_length, output_length, ids, chat, parent, kind, turn))
    table = pd.DataFrame(
        rows,
        columns=[
            "line",
            "arrival_s",
            "input_length",
            "output_length",
            "hash_ids",
            "chat_id",
            "parent_chat_id",
            "type",
            "turn",
        ],
    )
    table = table.sort_values(["arrival_s", "line"], kind="stable").reset_index(drop=True)
    row_of = {chat: i for i, chat in enumerate(table["chat_id"])}
    parent_rows: list[int] = []
    orphans = 0
    for parent, arrival, lineno in zip(
        table["parent_chat_id"], table["arrival_s"], table["line"], strict=True
    ):
        if parent == -1 or parent == "-1":
            parent_rows.append(-1)
            continue
        row = row_of.get(parent)
        if row is None:
            orphans += 1
            parent_rows.append(-1)
            continue
        if table.at[row, "arrival_s"] > arrival:
            raise fail(
                path,
                lineno,
                f"'timestamp' {arrival:g} is before its parent {parent!r}'s "
                f"{table.at[row, 'arrival_s']:g} (line {table.at[row, 'line']})",
            )
        parent_rows.append(row)
    conversation: list[str] = []
    for i in range(len(parent_rows)):
        # Parents arrive no later than children and sort first at equal times unless their
        # line comes later; resolve those by walking the chain (it cannot cycle: each step
        # goes to an earlier or equal timestamp, and a repeated row means a cycle).
        root, seen = i, {i}
        while parent_rows[root] != -1:
            root = parent_rows[root]
            if root in seen:
                lineno = int(table.at[i, "line"])
                raise fail(path, lineno, "'parent_chat_id' chain loops back on itself")
            seen.add(root)
        conversation.append(str(table.at[root, "chat_id"]))
    table["conversation_id"] = conversation
    table["parent_row"] = parent_rows
    table["turn_index"] = table["turn"] - 1
    return table, orphans
