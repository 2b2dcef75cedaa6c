"""The plugin's memory of conversations: what an access-only model needs from earlier turns.

One entry per conversation id, replaced when a request of that conversation finishes, bounded
by entries, stored tokens and idle time. A finished request's tokens are kept as references to
vLLM's own lists and block hashes and compacted later on a background thread, so the next
request's exact shared prefix costs O(log blocks) hash comparisons on the scheduler thread.

Bounds and the shared prefix: docs/design.md, "The conversation table".
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

from predictor.access_features import ConversationState, RequestState

EMPTY_CONVERSATION = ConversationState()


# A stored sequence's tokens: (prompt, its length then, output) with vLLM's lists referenced,
# or one array. The length is kept since a list vLLM still owns may grow later.
StoredTokens: TypeAlias = "tuple[Sequence[int], int, Sequence[int]] | array"
COMPACT_CHUNK_TOKENS = 4096  # tokens converted per step of `compact` (about 20 µs)
FIRST_CHUNK_TOKENS = 16  # tokens compared first past the hashes (a block at vLLM's default)


@dataclass(slots=True)
class StoredSequence:
    """A finished request's prompt + output, as its conversation's next request compares
    with it. `tokens` is replaced by one assignment when compacted (readers take it once)."""

    tokens: StoredTokens
    num_tokens: int
    block_hashes: Sequence[Any] = ()  # vLLM's chained hashes of its full blocks, referenced

    @classmethod
    def of_request(cls, request: Any) -> StoredSequence:
        """vLLM's request, referenced: its prompt list (else `all_token_ids`), its output
        and its block hashes. O(1): nothing is copied."""
        prompt = getattr(request, "prompt_token_ids", None)
        if isinstance(prompt, list):
            output = request.output_token_ids
            tokens: StoredTokens = (prompt, len(prompt), output)
            count = len(prompt) + len(output)
        else:
            everything = request.all_token_ids
            count = len(everything)
            tokens = (everything, count, ())
        hashes = getattr(request, "block_hashes", None)
        return cls(tokens, count, hashes if isinstance(hashes, list) else ())

    def slice(self, start: int, stop: int) -> list[Any]:
        """Tokens [start, stop) as a list."""
        tokens = self.tokens
        if type(tokens) is array:
            return tokens[start:stop].tolist()
        prompt, n, output = tokens
        if stop <= n:
            return list(prompt[start:stop])
        if start >= n:
            return list(output[start - n : stop - n])
        return list(prompt[start:n]) + list(output[: stop - n])

    def compact(self) -> bool:
        """Replace the referenced lists by one array (4 bytes a token; 8 beyond 32 bits),
        converted `COMPACT_CHUNK_TOKENS` at a time; False if the tokens are not integers
        (the references then stay)."""
        tokens = self.tokens
        if type(tokens) is array:
            return True
        prompt, n, output = tokens
        out = array("i")
        try:
            for part, length in ((prompt, n), (output, self.num_tokens - n)):
                for i in range(0, length, COMPACT_CHUNK_TOKENS):
                    chunk = part[i : min(length, i + COMPACT_CHUNK_TOKENS)]
                    before = len(out)
                    try:
                        out.extend(chunk)
                    except OverflowError:  # ids beyond 32 bits: 8 bytes each from now on
                        del out[before:]  # extend stopped part way through the chunk
                        out = array("q", out)
                        out.extend(chunk)
        except TypeError:
            return False
        self.tokens = out
        return True


@dataclass(slots=True)
class ConversationEntry:
    state: ConversationState
    updated_s: float  # when its latest request finished (the table's clock)
    previous: StoredSequence | None = None  # the latest request's prompt + output


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
        sequence: StoredSequence | None = None,
    ) -> ConversationState:
        """Record a finished request; the state its conversation's next request will see."""
        entries = self.entries
        old = entries.pop(conversation_id, None)
        if old is not None and old.previous is not None:
            self.stored_tokens -= old.previous.num_tokens
        previous = old.state if old is not None else EMPTY_CONVERSATION
        state = previous.after(request)
        if sequence is not None and sequence.num_tokens > self.max_tokens:
            sequence = None  # one sequence above the whole budget is not kept
        entries[conversation_id] = ConversationEntry(state, now_s, sequence)
        if sequence is not None:
            self.stored_tokens += sequence.num_tokens
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
        if entry.previous is not None:
            self.stored_tokens -= entry.previous.num_tokens

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
    the same value `lpc.replay.request_table.common_prefix_tokens` computes for a trace table.
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


def first_differing_block(previous: Sequence[Any], current: Sequence[Any], blocks: int) -> int:
    """The first of the first `blocks` chained block hashes that differ (`blocks` if none).
    Chained hashes agree on a prefix of blocks and differ after it, so bisection finds it."""
    if blocks <= 0 or previous[blocks - 1] == current[blocks - 1]:
        return blocks  # the common case: the new prompt extends every shared block
    low, high = 0, blocks - 1  # the answer is in [low, high]; block `high` differs
    while low < high:
        middle = (low + high) // 2
        if previous[middle] == current[middle]:
            low = middle + 1
        else:
            high = middle
    return low


def shared_prefix(
    previous: StoredSequence | None,
    prompt: Sequence[int] | None,
    prompt_tokens: int,
    block_hashes: Sequence[Any] = (),
    block_size: int | None = None,
) -> int:
    """Longest common prefix of the previous request's tokens and the first `prompt_tokens`
    of `prompt` (this request's tokens; 0 if either is unknown): `shared_prefix_tokens`'s
    value, found from the block hashes and one block of tokens (docs/design.md, "The conversation
    table")."""
    if previous is None or prompt is None:
        return 0
    n = min(previous.num_tokens, prompt_tokens, len(prompt))
    if n <= 0:
        return 0
    start = 0
    old_hashes = previous.block_hashes
    if block_size and block_hashes and old_hashes:
        # Only blocks wholly inside the compared range: an equal hash then means equal tokens.
        blocks = min(len(old_hashes), len(block_hashes), n // block_size)
        start = first_differing_block(old_hashes, block_hashes, blocks) * block_size
    chunk = max(block_size or FIRST_CHUNK_TOKENS, 1)
    while start < n:
        stop = min(n, start + chunk)
        old = previous.slice(start, stop)
        new = prompt[start:stop]
        if type(new) is not list:
            new = list(new)
        if old != new:
            for i, token in enumerate(old):
                if token != new[i]:
                    return start + i
        start = stop
        chunk *= 2  # past a block whose hash differed with equal tokens: go faster
    return n
