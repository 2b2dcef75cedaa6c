"""T-LRU: tail-optimized LRU; the part of a conversation the next turn's TTFT does not need goes
first, then LRU.

Zhang et al., NeurIPS 2025, from its published description. A request that releases a chain
of L blocks keeps blocks at depth < max(L + Q̂ − ξ, 0); deeper ones are TEL-safe and go first
(phase 1), then the others (phase 2), each an LRU queue. The replay fits Q̂ and ξ on the
training part (`lpc.replay.fitted_policies`).

The source and what the policy cannot see: docs/design.md, "T-LRU and SGLang's tlru".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from eviction.base import Evictor, FreedBlocks, Release
from eviction.linked_list import BlockList

NOT_QUEUED, SAFE, REST = 0, 1, 2


def check_blocks(value: object, what: str) -> int:
    """Raise ValueError unless `value` is an int >= 0 (a count of blocks)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an int >= 0 (blocks), got {value!r}")
    return value


class TLRUEvictor(Evictor):
    """Uncached blocks, then TEL-safe blocks in LRU order, then the rest in LRU order."""

    name: ClassVar[str] = "tlru"

    def __init__(self, num_blocks: int, threshold_blocks: int = 0, next_prompt_blocks: int = 0):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"{self.name}: num_blocks must be an int >= 0, got {num_blocks!r}")
        self.threshold_blocks = check_blocks(threshold_blocks, f"{self.name}: threshold_blocks")
        self.next_prompt_blocks = check_blocks(
            next_prompt_blocks, f"{self.name}: next_prompt_blocks"
        )
        self._num_blocks = num_blocks
        self._uncached = BlockList(num_blocks)
        self._safe = BlockList(num_blocks)  # phase 1
        self._rest = BlockList(num_blocks)  # phase 2
        self._clear()

    def _clear(self) -> None:
        n = self._num_blocks
        self._depth = [0] * n
        self._history = [0] * n  # the L the block's safety was decided with (blocks)
        self._queue = [NOT_QUEUED] * n  # which of the two queues holds a free cached block
        self._release: Release | None = None
        self._release_blocks = 0  # L of the release being processed
        self._release_freed: list[int] = []  # its blocks freed by the first call

    def budget(self, history_blocks: int) -> int:
        """Blocks of a chain of `history_blocks` the next turn needs cached: L + Q̂ − ξ."""
        return max(history_blocks + self.next_prompt_blocks - self.threshold_blocks, 0)

    def is_tel_safe(self, block_id: int) -> bool:
        return self._depth[block_id] >= self.budget(self._history[block_id])

    # -- a release ------------------------------------------------------------------------
    def _begin(self, freed: FreedBlocks, release: Release) -> bool:
        """Note the release's chain length; True when it grew after blocks were queued."""
        longest = max(freed.depths, default=-1) + 1
        if release is not self._release:
            self._release, self._release_blocks, self._release_freed = release, longest, []
            return False
        if longest <= self._release_blocks:
            return False
        self._release_blocks = longest
        return True

    def _place(self, block_ids: Sequence[int]) -> None:
        """Queue freed blocks (depths known) by the release's L: the whole chain's budget."""
        history, depth, queue = self._history, self._depth, self._queue
        length = self._release_blocks
        budget = self.budget(length)
        safe, rest = self._safe, self._rest
        for block_id in block_ids:
            history[block_id] = length
            if depth[block_id] >= budget:
                safe.append(block_id)
                queue[block_id] = SAFE
            else:
                rest.append(block_id)
                queue[block_id] = REST

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        if self._begin(freed, release):
            self._requeue_freed()
        depth = self._depth
        for block_id, block_depth in zip(freed.block_ids, freed.depths, strict=True):
            depth[block_id] = block_depth
        self._place(freed.block_ids)
        self._release_freed.extend(freed.block_ids)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        if self._begin(freed, release):
            self._requeue_freed()
        for block_id, block_depth in zip(freed.block_ids, freed.depths, strict=True):
            self._depth[block_id] = block_depth
        self._note_shared(freed.block_ids)

    def _note_shared(self, block_ids: Sequence[int]) -> None:
        """Blocks in use were released by one of their requests (nothing to queue here)."""
        return None

    def _requeue_freed(self) -> None:
        """The release's L grew: its freed blocks still free take their places again, in
        their release order (ahead of nothing released later: they are the newest)."""
        still_free = [b for b in self._release_freed if self._queue[b] != NOT_QUEUED]
        for block_id in still_free:
            self._dequeue(block_id)
        self._place(still_free)

    def _dequeue(self, block_id: int) -> None:
        (self._safe if self._queue[block_id] == SAFE else self._rest).remove(block_id)
        self._queue[block_id] = NOT_QUEUED

    # -- the evictor contract -------------------------------------------------------------
    def reset(self, block_ids: Iterable[int]) -> None:
        self._uncached.clear_to(block_ids)
        self._safe.clear_to(())
        self._rest.clear_to(())
        self._clear()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        history = self._history
        for block_id in block_ids:
            history[block_id] = 0  # the content is gone
        self._uncached.prepend_n(block_ids)

    def remove(self, block_id: int) -> None:
        if self._queue[block_id] != NOT_QUEUED:
            self._dequeue(block_id)
        else:
            self._uncached.remove(block_id)

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        if n > len(self):
            raise IndexError(f"cannot pop {n} blocks: only {len(self)} are free")
        out = self._uncached.pop_n(min(n, self._uncached.size))
        history, queue = self._history, self._queue
        for source in (self._safe, self._rest):
            if len(out) == n:
                break
            for block_id in source.pop_n(min(n - len(out), source.size)):
                history[block_id] = 0  # evicted: its content is gone
                queue[block_id] = NOT_QUEUED
                out.append(block_id)
        return out

    def __len__(self) -> int:
        return self._uncached.size + self._safe.size + self._rest.size

    def __contains__(self, block_id: object) -> bool:
        # `in` each of the three lists (all over the same block range), its check made once
        if not isinstance(block_id, int) or not 0 <= block_id < self._num_blocks:
            return False
        return (
            self._uncached._nodes[block_id].prev is not None
            or self._safe._nodes[block_id].prev is not None
            or self._rest._nodes[block_id].prev is not None
        )

    def free_block_ids(self) -> list[int]:
        return [*self._uncached, *self._safe, *self._rest]

    def check_invariants(self) -> None:
        Evictor.check_invariants(self)
        for queue in (self._uncached, self._safe, self._rest):
            queue.check_invariants()
        for code, queue in ((SAFE, self._safe), (REST, self._rest)):
            for block_id in queue:
                assert self._queue[block_id] == code, f"{self.name}: block {block_id}'s queue tag"
                assert self.is_tel_safe(block_id) == (code == SAFE), (
                    f"{self.name}: block {block_id} is in the wrong phase"
                )
        tagged = sum(code != NOT_QUEUED for code in self._queue)
        assert tagged == self._safe.size + self._rest.size, f"{self.name}: stale queue tags"
