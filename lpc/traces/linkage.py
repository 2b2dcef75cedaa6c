"""Conversations inferred from shared prefixes, for traces that carry no conversation ids.

For requests in arrival order whose block ids are prefix hashes: a block is *shared* when its
fan-out is at least `shared_fanout`; a request links to the most recent earlier request holding
its deepest block any earlier request holds, unless that block is shared, and joins its
conversation with turn index parent's + 1 (several later requests may link to one parent, as
branches of the same turn). The rule and why: docs/traces.md, "Prefix linkage (Mooncake)".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from lpc.errors import InvalidInputError

DEFAULT_SHARED_FANOUT = 8
_END = -1  # the "prompt ends here" successor


@dataclass(frozen=True)
class Linkage:
    parent: list[int]  # row of the parent request, -1 for a conversation's first request
    conversation: list[int]  # row of the conversation's first request
    turn_index: list[int]
    shared_blocks: int  # block ids with fan-out >= shared_fanout
    shared_fanout: int

    @property
    def linked_requests(self) -> int:
        return sum(p >= 0 for p in self.parent)

    @property
    def conversations(self) -> int:
        return len(set(self.conversation))

    @property
    def branched_parents(self) -> int:
        """Requests that more than one later request continues."""
        children: dict[int, int] = defaultdict(int)
        for p in self.parent:
            if p >= 0:
                children[p] += 1
        return sum(n > 1 for n in children.values())

    def stats(self) -> dict[str, int | float]:
        requests = len(self.parent)
        return {
            "requests": requests,
            "linked_requests": self.linked_requests,
            "linked_share": self.linked_requests / requests if requests else 0.0,
            "conversations": self.conversations,
            "multi_turn_conversations": sum(n > 1 for n in _counts(self.conversation).values()),
            "max_turns": max(self.turn_index, default=-1) + 1,
            "branched_parents": self.branched_parents,
            "shared_blocks": self.shared_blocks,
            "shared_fanout": self.shared_fanout,
        }


def _counts(values: Sequence[int]) -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    for v in values:
        out[v] += 1
    return out


def block_fanout(hash_ids: Sequence[Sequence[int]]) -> dict[int, int]:
    """Distinct successors of every block id across the trace ("ends here" counts as one)."""
    successors: dict[int, set[int]] = defaultdict(set)
    for ids in hash_ids:
        for i, h in enumerate(ids):
            successors[h].add(ids[i + 1] if i + 1 < len(ids) else _END)
    return {h: len(s) for h, s in successors.items()}


def link_by_prefix(
    hash_ids: Sequence[Sequence[int]], shared_fanout: int = DEFAULT_SHARED_FANOUT
) -> Linkage:
    """Parents, conversations and turn indices of requests given in arrival order."""
    if shared_fanout < 2:
        raise InvalidInputError(f"shared_fanout must be >= 2, got {shared_fanout}")
    fanout = block_fanout(hash_ids)
    holder: dict[int, int] = {}  # block id -> most recent request holding it
    parent: list[int] = []
    conversation: list[int] = []
    turn: list[int] = []
    for row, ids in enumerate(hash_ids):
        link = -1
        for h in reversed(ids):
            earlier = holder.get(h)
            if earlier is not None:
                if fanout[h] < shared_fanout:
                    link = earlier
                break
        parent.append(link)
        conversation.append(conversation[link] if link >= 0 else row)
        turn.append(turn[link] + 1 if link >= 0 else 0)
        for h in ids:
            holder[h] = row
    shared = sum(n >= shared_fanout for n in fanout.values())
    return Linkage(parent, conversation, turn, shared, shared_fanout)
