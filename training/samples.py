"""Training samples: one per user turn, labelled 1 iff the conversation has another user turn.

A sample carries what the predictor sees (the current user prompt and up to N before it, the
turn count) and, for opt-in experiments, what a serving engine also knows by the time the
request finishes and releases its blocks (the assistant's reply, the conversation's size).
Samples are made from `Conversation`s of any loader; which half of the data they belong to is
`training.split`'s decision, never ours.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from predictor.features import ConversationWindow
from training.conversation import Conversation

VALIDATION_SALT = "lpc-validation-v1"
DEFAULT_VALIDATION_FRACTION = 0.1


@dataclass(frozen=True, slots=True)
class TurnSample:
    """One user turn of one conversation.

    `window` holds the last `window_size` user prompts up to and including this turn's (oldest
    first); `turn_count` counts user turns so far, this one included (1 on the first turn).
    `reply` is the assistant's answer to this turn ("" when the data has none) and
    `context_chars` the characters of every message up to and including that reply.
    `request_tokens` (prompt + output) and `output_tokens` are the request's size in the
    serving engine's tokens, when a caller attached them (`with_token_counts`).
    """

    conversation_id: str
    split_key: str
    turn_count: int
    label: int
    window: tuple[str, ...]
    reply: str
    context_chars: int
    request_tokens: int | None = None
    output_tokens: int | None = None

    def predictor_window(self) -> ConversationWindow:
        return ConversationWindow(self.conversation_id, self.window, self.turn_count)


def conversation_samples(conversation: Conversation, window_size: int) -> list[TurnSample]:
    """The samples of one conversation, in turn order."""
    if window_size < 1:
        raise ValueError(f"window_size must be >= 1, got {window_size}")
    samples: list[TurnSample] = []
    prompts: list[str] = []
    total_turns = conversation.num_user_turns
    context = 0
    messages = conversation.messages
    for index, message in enumerate(messages):
        context += len(message.content)
        if message.role != "user":
            continue
        prompts.append(message.content)
        following = messages[index + 1] if index + 1 < len(messages) else None
        reply = following.content if following is not None and following.role == "assistant" else ""
        turn = len(prompts)
        samples.append(
            TurnSample(
                conversation_id=conversation.conversation_id,
                split_key=conversation.split_key,
                turn_count=turn,
                label=int(turn < total_turns),
                window=tuple(prompts[-window_size:]),
                reply=reply,
                context_chars=context + len(reply),
            )
        )
    return samples


# (conversation id, 0-based turn index) -> (request tokens, output tokens) in serving tokens
TokenCounts = Mapping[tuple[str, int], tuple[int, int]]


class TokenCounter(Protocol):
    """Counts each user turn's request in the serving engine's tokens. Supplied by the caller
    (the `lpc` commands pass the serving tokenizer and chat template); `name` identifies the
    tokenizer and template and is recorded in the artifact."""

    name: str

    def __call__(self, conversations: Sequence[Conversation]) -> TokenCounts: ...


def with_token_counts(
    samples: Sequence[TurnSample], counts: TokenCounts
) -> tuple[list[TurnSample], int]:
    """The samples that have counts, with the counts attached, and how many had none (turns a
    serving engine would never see, e.g. cut at its maximum model length)."""
    kept: list[TurnSample] = []
    for sample in samples:
        count = counts.get((sample.conversation_id, sample.turn_count - 1))
        if count is not None:
            kept.append(replace(sample, request_tokens=int(count[0]), output_tokens=int(count[1])))
    return kept, len(samples) - len(kept)


def build_samples(conversations: Iterable[Conversation], window_size: int) -> list[TurnSample]:
    """Every user turn of every conversation, conversation by conversation."""
    samples: list[TurnSample] = []
    for conversation in conversations:
        samples.extend(conversation_samples(conversation, window_size))
    return samples


def is_validation(split_key: str, fraction: float = DEFAULT_VALIDATION_FRACTION) -> bool:
    """Whether a training-half conversation is held out for validation (early stopping).

    A salted SHA-256 of the split key, independent of `training.split`'s salt, so validation is
    a stable random share of the training half and pieces of one chat stay together.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must be in (0, 1), got {fraction!r}")
    digest = hashlib.sha256(f"{VALIDATION_SALT}\0{split_key}".encode("utf-8", "surrogatepass"))
    value = int.from_bytes(digest.digest()[:8], "big")
    return value < int(fraction * (1 << 64))


def validation_mask(samples: Sequence[TurnSample], fraction: float) -> np.ndarray:
    """Boolean array: True for samples of validation conversations."""
    verdicts: dict[str, bool] = {}
    mask = np.zeros(len(samples), dtype=bool)
    for i, sample in enumerate(samples):
        key = sample.split_key
        if key not in verdicts:
            verdicts[key] = is_validation(key, fraction)
        mask[i] = verdicts[key]
    return mask


def labels_of(samples: Sequence[TurnSample]) -> np.ndarray:
    return np.fromiter((s.label for s in samples), dtype=np.int64, count=len(samples))


def turn_counts_of(samples: Sequence[TurnSample]) -> np.ndarray:
    return np.fromiter((s.turn_count for s in samples), dtype=np.int64, count=len(samples))


def samples_fingerprint(samples: Sequence[TurnSample]) -> str:
    """SHA-256 over every sample's identity, label and window text: names a training set."""
    digest = hashlib.sha256()
    for s in samples:
        digest.update(
            f"{len(s.conversation_id)}:{s.conversation_id}|{s.turn_count}|{s.label}|".encode(
                "utf-8", "surrogatepass"
            )
        )
        for prompt in s.window:
            encoded = prompt.encode("utf-8", "surrogatepass")
            digest.update(len(encoded).to_bytes(8, "little"))
            digest.update(encoded)
    return digest.hexdigest()
