"""The least a free queue keyed per release must do inside vLLM's `BlockPool`: a lower bound.

Not a policy. `lpc bench queue --manager` runs it beside stock and LPC's queue, and `lpc
vllm-ab --policies floor` in stock vLLM's pool, to say what a Python queue keyed once per
release can cost at this seam at all, so that the gap between LPC and stock splits into what
the seam forces and what LPC's design adds (docs/serving.md, "The floor: what the seam costs,
and what LPC's queue adds"). It does the O(1) part of an engine-grade queue and nothing else:
a release is one heap push of its block list (no pass over its blocks), a hit is one tombstone
(the release count when the block was taken out), a pop walks runs from the smallest key and
skips tombstoned blocks. It keeps no prefix closure, no memory across conversations, no pins
and no ages; its key is the release's count (LRU by release), since any key costs the same
push.

`PooledFloorQueue` adds the least that pooling over the conversations sharing a block needs,
which every LPC evictor does (plain `lpc`'s max pooling, `lpc-pooled`'s OR pooling): each
block's key, written at its release and read at its next one. That is a pass over the
released blocks, their ids read from vLLM's `KVCacheBlock`s (slotted and unhashable, so the
id is the only handle), the old keys gathered and the new one scattered, here by numpy, the
cheapest pass measured (docs/serving.md, "The memory by chain, and the pooled floor"); a key
from a p and the time; and, at a pop, the popped blocks' keys cleared (their content is gone).
With keys that grow with time a release's own key is always the largest, so it evicts as the
floor does.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np

_block_id = attrgetter("block_id")
_NO_KEY = -math.inf  # a block no release keyed (or whose content a pop took)
_LOGIT = math.log(0.7 / 0.3)  # a release's p, as the manager benchmark's requests carry
_SCALE_PER_S = 0.01  # LPC's default decay scale


class RunFloorQueue:
    """vLLM's queue interface over vLLM's own list (blocks without a hash, as vLLM puts them)
    and a heap of released runs; `num_free_blocks` is their sum, as in the LPC queue."""

    def __init__(self, listed: Any, num_blocks: int) -> None:
        self._list = listed  # vLLM's FreeKVCacheBlockQueue: its hash-less blocks
        # Per block, the release count when a hit last took it out: a run released at or
        # before that count no longer holds the block (one store per hit, none per release).
        self._taken_at = [0] * num_blocks
        self._releases = 0
        self._runs: list[list[Any]] = []  # [key, release count, blocks, cursor], a min-heap
        self._held = 0

    @property
    def num_free_blocks(self) -> int:
        return self._list.num_free_blocks + self._held

    def append_n(self, blocks: Sequence[Any]) -> None:
        if not blocks:
            return
        self._releases += 1
        # vLLM hands each call a fresh list: the run keeps it, and reads no block of it.
        heapq.heappush(self._runs, [self._releases, self._releases, blocks, 0])
        self._held += len(blocks)

    def append(self, block: Any) -> None:
        self.append_n([block])

    def prepend_n(self, blocks: Sequence[Any]) -> None:
        self._list.prepend_n(blocks)

    def remove(self, block: Any) -> None:
        if block.prev_free_block is not None:
            self._list.remove(block)
            return
        self._taken_at[block.block_id] = self._releases
        self._held -= 1

    def popleft(self) -> Any:
        return self.popleft_n(1)[0]

    def get_all_free_blocks(self) -> list[Any]:
        """vLLM's list, then every run's blocks it still holds (for end-of-run checks)."""
        taken_at = self._taken_at
        held = [
            block
            for _, released, blocks, cursor in self._runs
            for block in blocks[cursor:]
            if taken_at[block.block_id] < released
        ]
        return self._list.get_all_free_blocks() + held

    def popleft_n(self, n: int) -> list[Any]:
        if n == 0:
            return []
        listed = self._list
        in_list = listed.num_free_blocks
        if n <= in_list:
            return listed.popleft_n(n)
        if n > in_list + self._held:
            raise ValueError(f"cannot pop {n} blocks: only {in_list + self._held} are free")
        out = listed.popleft_n(in_list) if in_list else []
        want = n - in_list
        self._held -= want
        runs, taken_at = self._runs, self._taken_at
        while want:
            run = runs[0]
            released, blocks, i = run[1], run[2], run[3]
            end = len(blocks)
            while i < end and want:
                block = blocks[i]
                i += 1
                if taken_at[block.block_id] < released:
                    out.append(block)
                    want -= 1
            if i == end:
                heapq.heappop(runs)
            else:
                run[3] = i
        return out


class PooledFloorQueue(RunFloorQueue):
    """The floor with pooling's per-block keys: a release reads its blocks' keys and writes
    its own (one numpy gather and one scatter over their ids), a pop clears its blocks'."""

    def __init__(self, listed: Any, num_blocks: int) -> None:
        super().__init__(listed, num_blocks)
        self._key_of = np.full(num_blocks, _NO_KEY)

    def append_n(self, blocks: Sequence[Any]) -> None:
        if not blocks:
            return
        n = len(blocks)
        self._releases += 1
        ids = np.fromiter(map(_block_id, blocks), dtype=np.intp, count=n)
        key_of = self._key_of
        key = _LOGIT + _SCALE_PER_S * time.monotonic()
        pooled = float(key_of[ids].max())  # max pooling over the blocks' last releases
        if pooled > key:
            key = pooled
        key_of[ids] = key
        heapq.heappush(self._runs, [key, self._releases, blocks, 0])
        self._held += n

    def popleft_n(self, n: int) -> list[Any]:
        out = super().popleft_n(n)
        if out:
            self._key_of[np.fromiter(map(_block_id, out), dtype=np.intp, count=len(out))] = _NO_KEY
        return out
