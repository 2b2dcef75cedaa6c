"""The train/evaluation split: which half of the data a conversation belongs to, for good.

Training and the A/B harness both call `split_of`, the single source of truth, so the
evaluation half is never trained on. The split hashes a conversation's `split_key` (its group
id when the data cut one chat into pieces, e.g. ShareGPT segments `X_0, X_1` → `X`, or the two
sides `Q:a`, `Q:b` of one Chatbot-Arena question → `Q`; else its id) with SHA-256 and a fixed,
versioned salt: the answer never depends on the process, the machine, the data set's order or
which other conversations are loaded. Changing `SPLIT_VERSION` reshuffles everything and
invalidates every trained model's held-out numbers; do it only on purpose.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from training.conversation import Conversation

Split = Literal["train", "eval"]
TRAIN: Split = "train"
EVAL: Split = "eval"
SPLITS: tuple[Split, ...] = (TRAIN, EVAL)

SPLIT_VERSION = "lpc-split-v1"
# A key goes to evaluation when the first 8 bytes of its salted SHA-256, read as a big-endian
# unsigned integer, are below this: half of the 2**64 values.
EVAL_BELOW = 1 << 63


def split_of(split_key: str) -> Split:
    """`"train"` or `"eval"` for a conversation's `split_key` (pass `conversation.split_key`,
    not `conversation_id`: pieces of one chat share the key, not the id)."""
    if not isinstance(split_key, str) or not split_key:
        raise ValueError(f"split_key must be a non-empty str, got {split_key!r}")
    salted = f"{SPLIT_VERSION}\0{split_key}".encode("utf-8", "surrogatepass")
    value = int.from_bytes(hashlib.sha256(salted).digest()[:8], "big")
    return EVAL if value < EVAL_BELOW else TRAIN


def split_of_conversation(conversation: Conversation) -> Split:
    return split_of(conversation.split_key)


@dataclass(frozen=True, slots=True)
class SplitConversations:
    """Conversations partitioned by `split_of`, each half in input order."""

    train: list[Conversation]
    eval: list[Conversation]

    def __getitem__(self, split: Split) -> list[Conversation]:
        if split == TRAIN:
            return self.train
        if split == EVAL:
            return self.eval
        raise KeyError(f"split must be one of {SPLITS}, got {split!r}")


def partition_conversations(conversations: Iterable[Conversation]) -> SplitConversations:
    halves: dict[Split, list[Conversation]] = {TRAIN: [], EVAL: []}
    for conversation in conversations:
        halves[split_of(conversation.split_key)].append(conversation)
    return SplitConversations(train=halves[TRAIN], eval=halves[EVAL])


def conversations_in_split(
    conversations: Iterable[Conversation], split: Split
) -> list[Conversation]:
    """The conversations of one half, in input order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [c for c in conversations if split_of(c.split_key) == split]
