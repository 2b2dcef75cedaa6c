"""Conversation windows as JSON Lines: one `{"conversation_id", "user_prompts", "turn_count"}`
object per line, with `"prompt_tokens"` when known (the RPC's item shape), so a benchmark input
can be saved and replayed."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from predictor.errors import UserError
from predictor.features import ConversationWindow
from predictor.rpc_schema import window_to_json


class WindowsFileError(UserError, ValueError):
    """A line of a windows file is not a valid window (the message names file and line)."""


def read_windows_jsonl(path: Path | str, limit: int | None = None) -> list[ConversationWindow]:
    path = Path(path)
    windows: list[ConversationWindow] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise TypeError("not a JSON object")
                prompts = record["user_prompts"]
                turn_count = record.get("turn_count", len(prompts))
                windows.append(
                    ConversationWindow(
                        str(record["conversation_id"]),
                        tuple(prompts),
                        turn_count,
                        record.get("prompt_tokens"),
                    )
                )
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
                raise WindowsFileError(
                    f"{path}:{number}: {type(error).__name__}: {error}"
                ) from error
            if limit is not None and len(windows) >= limit:
                break
    if not windows:
        raise WindowsFileError(f"{path}: no windows")
    return windows


def write_windows_jsonl(path: Path | str, windows: Iterable[ConversationWindow]) -> int:
    count = 0
    with Path(path).open("w", encoding="utf-8") as handle:
        for window in windows:
            handle.write(json.dumps(window_to_json(window), ensure_ascii=False) + "\n")
            count += 1
    return count
