"""The cleaning rules every loader applies, so all formats come out in one shape.

A cleaned conversation is: at most one system message, first; then user and assistant
messages alternating, starting with a user message. Roles are mapped by `ROLE_MAP`, empty
messages dropped, misplaced system and assistant messages dropped, consecutive messages of one
role merged; text is otherwise kept exactly as found. Every change is counted.

The rules in order, and lone surrogates: docs/design.md, "Cleaning conversations".
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from training.conversation import Message, Role
from training.loaders.report import LoadReport, SkipReason

MESSAGE_JOIN_SEPARATOR = "\n\n"
PART_TEXT_SEPARATOR = "\n"  # vLLM joins the text parts of one message with a newline
# JSON can spell half of a surrogate pair (a lone "\ud83d" escape), which is no character:
# no tokenizer or UTF-8 encoder accepts it.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a lone surrogate; as `_LONE_SURROGATE.search`, much faster.

    Surrogates are the only code points strict UTF-8 cannot encode, so a text that is ASCII
    (a flag CPython keeps) or that encodes holds none; C-speed checks for the common case."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.search(text) is not None
    return False


ROLE_MAP: dict[str, Role] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
    "developer": "system",  # OpenAI's newer name for the system prompt
}


class RecordProblem(Exception):
    """Why one record does not fit its format; the pipeline turns it into a skip or an error."""

    def __init__(self, reason: SkipReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def require_field(record: dict, key: str, what: str = "record") -> object:
    if key not in record:
        raise RecordProblem(SkipReason.MISSING_FIELD, f"{what} has no {key!r} field")
    return record[key]


def record_id(record: dict, key: str) -> str:
    """A record's id as text; ints are accepted (some dumps store numeric ids). An id holding
    a lone surrogate is refused (`invalid_id`), not repaired as message text is: replacing
    it by U+FFFD would merge `a\\ud800`, `a\\udbff` and a real `a\\ufffd` into one
    conversation, and no file, report or exported trace can hold it as it is."""
    value = require_field(record, key)
    if isinstance(value, str) and value:
        match = _LONE_SURROGATE.search(value)
        if match is not None:
            raise RecordProblem(
                SkipReason.INVALID_ID,
                f"{key!r} is not valid Unicode: a lone surrogate \\u{ord(match.group()):04x} "
                f"at character {match.start()} (half of a UTF-16 pair; an id cannot be "
                "repaired without merging it with another)",
            )
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise RecordProblem(
        SkipReason.WRONG_TYPE, f"{key!r} must be a non-empty string, got {_describe(value)}"
    )


def message_list(record: dict, key: str) -> list:
    value = require_field(record, key)
    if not isinstance(value, list):
        raise RecordProblem(
            SkipReason.WRONG_TYPE, f"{key!r} must be a list, got {_describe(value)}"
        )
    return value


def raw_messages(
    messages: list, role_key: str, content_key: str, report: LoadReport, where: str = "messages"
) -> list[tuple[str, str]]:
    """(raw role, text) pairs of a message list, checking each message's shape."""
    pairs: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        # fast path for the common shape; the checks below only build their messages on failure
        if type(message) is dict:
            role = message.get(role_key)
            content = message.get(content_key)
            if type(role) is str and type(content) is str:
                pairs.append((role, content))
                continue
        at = f"{where}[{i}]"
        if not isinstance(message, dict):
            raise RecordProblem(
                SkipReason.WRONG_TYPE, f"{at} must be an object, got {_describe(message)}"
            )
        role = require_field(message, role_key, at)
        if not isinstance(role, str):
            raise RecordProblem(
                SkipReason.WRONG_TYPE, f"{at}.{role_key} must be a string, got {_describe(role)}"
            )
        content = require_field(message, content_key, at)
        pairs.append((role, content_text(content, report, f"{at}.{content_key}")))
    return pairs


def content_text(content: object, report: LoadReport, where: str) -> str:
    """A message's text: a string as is, None as empty, a list of parts as its text parts.

    Non-text parts (images, audio, …) carry no tokens a text model's prefix cache would see the
    same way, so they are ignored and counted by type in `non_text_parts`.
    """
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise RecordProblem(
            SkipReason.WRONG_TYPE,
            f"{where} must be a string, null or a list of parts, got {_describe(content)}",
        )
    texts: list[str] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise RecordProblem(
                SkipReason.WRONG_TYPE,
                f"{where}[{i}] must be an object with a string 'type', got {_describe(part)}",
            )
        if part["type"] != "text":
            report.non_text_parts[part["type"]] += 1
            continue
        text = part.get("text")
        if not isinstance(text, str):
            raise RecordProblem(
                SkipReason.WRONG_TYPE, f"{where}[{i}].text must be a string, got {_describe(text)}"
            )
        texts.append(text)
    return PART_TEXT_SEPARATOR.join(texts)


def normalise_messages(pairs: Iterable[tuple[str, str]], report: LoadReport) -> tuple[Message, ...]:
    """Apply the module's cleaning rules to (raw role, text) pairs, counting every change."""
    roles: list[Role] = []
    texts: list[list[str]] = []
    seen_user = False
    for raw_role, text in pairs:
        report.roles_seen[raw_role] += 1
        role = ROLE_MAP.get(raw_role) or ROLE_MAP.get(raw_role.strip().lower())
        if role is None:
            report.unknown_roles[raw_role] += 1
            continue
        if not text or text.isspace():
            report.empty_messages_dropped += 1
            continue
        if _has_lone_surrogate(text):
            text, replaced = _LONE_SURROGATE.subn("\ufffd", text)
            report.lone_surrogates_replaced += replaced
        if not seen_user:
            if role == "assistant":
                report.leading_assistant_messages_dropped += 1
                continue
            seen_user = role == "user"
        elif role == "system":
            report.late_system_messages_dropped += 1
            continue
        if roles and roles[-1] == role:
            texts[-1].append(text)
            report.same_role_messages_merged += 1
            continue
        roles.append(role)
        texts.append([text])
    return tuple(
        Message(role, parts[0] if len(parts) == 1 else MESSAGE_JOIN_SEPARATOR.join(parts))
        for role, parts in zip(roles, texts, strict=True)
    )


def _describe(value: object) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"
