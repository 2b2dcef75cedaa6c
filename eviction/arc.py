"""ARC: recency list T1 and frequency list T2, ghost lists B1 and B2, an adaptive target p.

Megiddo and Modha, FAST 2003, Figure 4, followed step by step over the block-manager events
of `eviction.resident`: the first release of a block's content is a miss, a hit on a free
cached block is Case I, and each popped cached block is one REPLACE, run at the pop (so the
tie |T1| = p goes to T2) and taking the least recent *free* block of a list.

The paper's steps, and the readings of this port: docs/design.md, "ARC, step by step".
"""

from __future__ import annotations

from collections import OrderedDict
from typing import ClassVar

from eviction.resident import ResidentEvictor


class ARCEvictor(ResidentEvictor):
    """The four lists as OrderedDicts, LRU first; p is a real number in [0, c]."""

    name: ClassVar[str] = "arc"

    def _clear_policy(self) -> None:
        self._t1: OrderedDict[int, None] = OrderedDict()
        self._t2: OrderedDict[int, None] = OrderedDict()
        self._b1: OrderedDict[bytes, None] = OrderedDict()
        self._b2: OrderedDict[bytes, None] = OrderedDict()
        self._hash_of: dict[int, bytes | None] = {}
        self.target_t1 = 0.0  # the paper's p: how many of the c blocks T1 should hold

    def _insert(self, block_id: int, block_hash: bytes | None) -> None:
        c = self._num_blocks
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        self._hash_of[block_id] = block_hash
        if block_hash is not None and block_hash in b1:  # Case II
            self.target_t1 = min(float(c), self.target_t1 + max(len(b2) / len(b1), 1.0))
            del b1[block_hash]
            t2[block_id] = None
        elif block_hash is not None and block_hash in b2:  # Case III
            self.target_t1 = max(0.0, self.target_t1 - max(len(b1) / len(b2), 1.0))
            del b2[block_hash]
            t2[block_id] = None
        else:  # Case IV
            if len(t1) + len(b1) >= c:
                if b1:
                    b1.popitem(last=False)
            elif len(t1) + len(t2) + len(b1) + len(b2) >= 2 * c and b2:
                b2.popitem(last=False)
            t1[block_id] = None

    def _hit(self, block_id: int) -> None:
        if block_id in self._t1:
            del self._t1[block_id]
            self._t2[block_id] = None
        else:
            self._t2.move_to_end(block_id)

    def _returned(self, block_id: int) -> None:
        self._t2.move_to_end(block_id)

    def _drop(self, block_id: int) -> None:
        self._t1.pop(block_id, None)
        self._t2.pop(block_id, None)
        del self._hash_of[block_id]

    def _lru_free(self, queue: OrderedDict[int, None]) -> int | None:
        """The least recent free block of the list (blocks in use are stepped over)."""
        free = self._free
        return next((block_id for block_id in queue if free[block_id]), None)

    def _evict(self) -> int:  # REPLACE
        from_t1 = self._lru_free(self._t1)
        from_t2 = self._lru_free(self._t2)
        if from_t1 is not None and (len(self._t1) > self.target_t1 or from_t2 is None):
            victim, queue, ghost = from_t1, self._t1, self._b1
        else:
            victim, queue, ghost = from_t2, self._t2, self._b2
        assert victim is not None, "arc: REPLACE called with no free cached block"
        del queue[victim]
        block_hash = self._hash_of.pop(victim)
        if block_hash is not None:
            # Two blocks may have held the same content: its newest ghost is the one that counts.
            self._b1.pop(block_hash, None)
            self._b2.pop(block_hash, None)
            ghost[block_hash] = None
        return victim

    def _check_policy(self) -> None:
        c = self._num_blocks
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        assert not set(t1) & set(t2), "arc: a block is in both T1 and T2"
        members = set(t1) | set(t2)
        assert members == set(self._hash_of), "arc: list members and their hashes disagree"
        assert members == {b for b in range(c) if self._resident[b]}, (
            "arc: T1 and T2 do not hold exactly the resident blocks"
        )
        assert not set(b1) & set(b2), "arc: a hash is in both ghost lists"
        assert len(t1) + len(b1) <= c, f"arc: |T1| + |B1| = {len(t1) + len(b1)} exceeds c = {c}"
        total = len(t1) + len(t2) + len(b1) + len(b2)
        assert total <= 2 * c, f"arc: the four lists hold {total} > 2c = {2 * c}"
        assert 0.0 <= self.target_t1 <= c, f"arc: p = {self.target_t1} left [0, {c}]"
