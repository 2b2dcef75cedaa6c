"""A brute-force LPC evictor written straight from the paper, for differential tests.

It keeps, per free cached block, the (p, t_last) of the releases that count under max pooling
and at every eviction recomputes every block's decayed probability
p·d / (p·d + 1 − p), d = exp(−scale·(now − t_last)) — no static keys, no heap — and takes the
smallest among the leaves (free blocks no cached block names as its parent: prefix closure).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from eviction import Evictor, FreedBlocks, Release, decayed_probability


def link_chain(parent: dict[int, int], freed: FreedBlocks) -> None:
    """Prefix closure: a chain release names each block's parent (block i + 1, then
    `parent_id`; an unknown parent keeps the old link)."""
    if not freed.chain:
        return
    ids = freed.block_ids
    for i, block_id in enumerate(ids):
        p = ids[i + 1] if i + 1 < len(ids) else freed.parent_id
        if p is not None:
            parent[block_id] = p


def leaves(free: Iterable[int], parent: dict[int, int]) -> list[int]:
    """The free blocks no cached block names as its parent: the only ones a prefix-closed
    evictor may take (all of them if none is, which only a corrupt chain gives)."""
    named = set(parent.values())
    out = [b for b in free if b not in named]
    return out or list(free)


class BruteForceLPC(Evictor):
    name = "lpc-reference"

    def __init__(
        self, num_blocks: int, scale_per_s: float = 1e-2, fallback_probability: float = 0.5
    ) -> None:
        self.scale = scale_per_s
        self.fallback = fallback_probability
        self.uncached: list[int] = []
        # block -> releases that count: [(p, t)], its single owner (None once shared)
        self.pooled: dict[int, list[tuple[float, float]]] = {}
        self.owner: dict[int, str | None] = {}
        self.shared: set[int] = set()
        self.free: dict[int, tuple[int, int]] = {}  # cached free block -> (depth, push order)
        self.parent: dict[int, int] = {}  # cached block -> its parent block (prefix closure)
        self.order = 0

    def reset(self, block_ids: Iterable[int]) -> None:
        self.uncached = list(block_ids)
        self.pooled.clear()
        self.owner.clear()
        self.shared.clear()
        self.free.clear()
        self.parent.clear()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        self.uncached[0:0] = list(block_ids)

    def _record(self, block_id: int, release: Release) -> None:
        p = self.fallback if release.probability is None else release.probability
        conv = release.conversation_id
        if block_id not in self.pooled:
            self.pooled[block_id] = [(p, release.time_s)]
            self.owner[block_id] = conv
        elif block_id not in self.shared and conv is not None and self.owner[block_id] == conv:
            self.pooled[block_id] = [(p, release.time_s)]  # its only conversation: replace
        else:
            self.shared.add(block_id)
            self.pooled[block_id].append((p, release.time_s))  # max over all of them

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        link_chain(self.parent, freed)
        for block_id, depth in zip(freed.block_ids, freed.depths, strict=True):
            self._record(block_id, release)
            self.free[block_id] = (depth, self.order)
            self.order += 1

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        for block_id in freed.block_ids:
            self._record(block_id, release)

    def remove(self, block_id: int) -> None:
        if block_id in self.free:
            del self.free[block_id]
        else:
            self.uncached.remove(block_id)

    def value(self, block_id: int, now_s: float) -> float:
        return max(decayed_probability(p, now_s - t, self.scale) for p, t in self.pooled[block_id])

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        out = []
        keys: dict[int, tuple] = {}  # each block's key, once per call (a victim changes none)
        for _ in range(n):
            if self.uncached:
                out.append(self.uncached.pop(0))
                continue
            if not keys:
                keys = {
                    b: (self.value(b, now_s), -depth, order)
                    for b, (depth, order) in self.free.items()
                }
            victim = min(leaves(self.free, self.parent), key=keys.__getitem__)
            del self.free[victim]
            del self.pooled[victim]
            self.parent.pop(victim, None)
            self.owner.pop(victim, None)
            self.shared.discard(victim)
            out.append(victim)
        return out

    def __len__(self) -> int:
        return len(self.uncached) + len(self.free)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self.free or block_id in self.uncached

    def free_block_ids(self) -> list[int]:
        return [*self.uncached, *self.free]
