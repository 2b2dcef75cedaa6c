"""SIEVE: one FIFO queue, a visited bit per block, and a hand that sweeps from tail to head.

Zhang et al., NSDI 2024, followed step by step over the block-manager events of
`eviction.resident`: the first release of a block's content is the insert, a hit on a free
cached block sets its bit, and each popped cached block is one eviction; the hand steps over
blocks in use without clearing their bit.

The pseudo-code and its reading: docs/design.md, "SIEVE, step by step".
"""

from __future__ import annotations

from typing import ClassVar

from eviction.resident import ResidentEvictor

NONE = -1  # no block: the end of the queue, or no hand


class SieveEvictor(ResidentEvictor):
    """The queue as two arrays of links indexed by block id (no node objects)."""

    name: ClassVar[str] = "sieve"

    def _clear_policy(self) -> None:
        n = self._num_blocks
        self._newer = [NONE] * n  # the paper's prev: towards the head
        self._older = [NONE] * n  # the paper's next: towards the tail
        self._visited = [False] * n
        self._head = NONE  # newest block
        self._tail = NONE  # oldest block
        self._hand = NONE

    def _insert(self, block_id: int, block_hash: bytes | None) -> None:
        self._visited[block_id] = False
        self._newer[block_id] = NONE
        self._older[block_id] = self._head
        if self._head == NONE:
            self._tail = block_id
        else:
            self._newer[self._head] = block_id
        self._head = block_id

    def _hit(self, block_id: int) -> None:
        self._visited[block_id] = True

    def _unlink(self, block_id: int) -> None:
        newer, older = self._newer[block_id], self._older[block_id]
        if newer == NONE:
            self._head = older
        else:
            self._older[newer] = older
        if older == NONE:
            self._tail = newer
        else:
            self._newer[older] = newer
        self._newer[block_id] = self._older[block_id] = NONE

    def _drop(self, block_id: int) -> None:
        if self._hand == block_id:
            self._hand = self._newer[block_id]
        self._unlink(block_id)

    def _evict(self) -> int:
        free, visited, newer = self._free, self._visited, self._newer
        o = self._hand if self._hand != NONE else self._tail
        while not free[o] or visited[o]:
            if free[o]:
                visited[o] = False
            o = newer[o] if newer[o] != NONE else self._tail
        self._hand = newer[o]
        self._unlink(o)
        return o

    def _check_policy(self) -> None:
        members = []
        block_id, previous = self._tail, NONE
        while block_id != NONE:
            assert self._older[block_id] == previous, f"sieve: block {block_id}'s links disagree"
            members.append(block_id)
            assert len(members) <= self._num_blocks, "sieve: the queue has a cycle"
            previous, block_id = block_id, self._newer[block_id]
        assert previous == self._head, "sieve: the head is not the newest block"
        resident = {b for b in range(self._num_blocks) if self._resident[b]}
        assert set(members) == resident and len(members) == len(resident), (
            "sieve: the queue does not hold exactly the resident blocks"
        )
        assert self._hand == NONE or self._hand in resident, "sieve: the hand left the queue"
