"""The plugin's memory of conversations: what an access-only model needs from earlier turns.

An access feature reads a request's conversation history (turn, think times, the previous
request's sizes and tokens: `predictor.access_features.ConversationState`). The engine forgets
a request once it finishes, so the plugin keeps one entry per conversation id, replaced when a
request of that conversation finishes. Memory is bounded three ways, all configurable: at most
`max_conversations` entries and `max_tokens` stored previous-request tokens (4 bytes each; only
kept when a model reads the shared prefix), least recently updated evicted first; and an entry
idle longer than `expiry_s` is dropped (a conversation coming back later starts afresh, as a
first request would). One `OrderedDict` in update order serves both LRU and expiry: its front
is always the entry idle longest.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from predictor.access_features import ConversationState, RequestState

EMPTY_CONVERSATION = ConversationState()


@dataclass(slots=True)
class ConversationEntry:
    state: ConversationState
    updated_s: float  # when its latest request finished (the table's clock)
    last_tokens: array | None = None  # the latest request's prompt + output token ids


@dataclass
class ConversationTable:
    """Conversation id -> the `ConversationState` its finished requests left behind."""

    max_conversations: int
    expiry_s: float
    max_tokens: int
    entries: OrderedDict[str, ConversationEntry] = field(default_factory=OrderedDict)
    stored_tokens: int = 0
    evicted: int = 0  # dropped for room (count or token bound)
    expired: int = 0  # dropped for being idle longer than expiry_s

    def __len__(self) -> int:
        return len(self.entries)

    def entry(self, conversation_id: str, now_s: float) -> ConversationEntry | None:
        """The conversation's entry, or None (never seen, evicted, or idle too long)."""
        self.expire(now_s)
        return self.entries.get(conversation_id)

    def state(self, conversation_id: str, now_s: float) -> ConversationState:
        found = self.entry(conversation_id, now_s)
        return found.state if found is not None else EMPTY_CONVERSATION

    def finished(
        self,
        conversation_id: str,
        request: RequestState,
        now_s: float,
        tokens: array | None = None,
    ) -> ConversationState:
        """Record a finished request; the state its conversation's next request will see."""
        entries = self.entries
        old = entries.pop(conversation_id, None)
        if old is not None and old.last_tokens is not None:
            self.stored_tokens -= len(old.last_tokens)
        previous = old.state if old is not None else EMPTY_CONVERSATION
        state = previous.after(request)
        if tokens is not None and len(tokens) > self.max_tokens:
            tokens = None  # one sequence above the whole budget is not kept
        entries[conversation_id] = ConversationEntry(state, now_s, tokens)
        if tokens is not None:
            self.stored_tokens += len(tokens)
        self.expire(now_s)
        while len(entries) > self.max_conversations or self.stored_tokens > self.max_tokens:
            self._drop_oldest()
            self.evicted += 1
        return state

    def expire(self, now_s: float) -> None:
        """Drop entries idle longer than `expiry_s` (the front is the one idle longest)."""
        entries = self.entries
        limit = now_s - self.expiry_s
        while entries and next(iter(entries.values())).updated_s < limit:
            self._drop_oldest()
            self.expired += 1

    def _drop_oldest(self) -> None:
        _, entry = self.entries.popitem(last=False)
        if entry.last_tokens is not None:
            self.stored_tokens -= len(entry.last_tokens)

    def counters(self) -> dict[str, int]:
        return {
            "conversations": len(self.entries),
            "conversation_tokens": self.stored_tokens,
            "conversations_evicted": self.evicted,
            "conversations_expired": self.expired,
        }


def token_array(token_ids: Any) -> array | None:
    """Token ids as a compact array (4 bytes each; 8 for ids beyond 32 bits); None if they
    are not a sequence of integers."""
    try:
        return array("i", token_ids)
    except OverflowError:
        return array("q", token_ids)
    except TypeError:
        return None


def shared_prefix_tokens(
    previous: array | None, prompt: array | None, prompt_tokens: int | None = None
) -> int:
    """Longest common prefix of the previous request's tokens and this prompt (0 if unknown):
    the same value `lpc.access.table.common_prefix_tokens` computes for a trace table.
    `prompt` may run on past the prompt (its output) when `prompt_tokens` says where it ends."""
    if previous is None or prompt is None:
        return 0
    n = min(len(previous), len(prompt) if prompt_tokens is None else prompt_tokens)
    if n == 0:
        return 0
    a = np.frombuffer(previous, dtype=np.int32 if previous.typecode == "i" else np.int64)[:n]
    b = np.frombuffer(prompt, dtype=np.int32 if prompt.typecode == "i" else np.int64)[:n]
    diff = np.flatnonzero(a != b)
    return int(diff[0]) if diff.size else n
