"""T-LRU: tail-optimized LRU; the part of a conversation the next turn's TTFT does not need goes
first, then LRU.

Source: "Tail-Optimized Caching for LLM Inference" (Zhang et al., NeurIPS 2025, arXiv
2510.15152), written from its published description: the abstract ("we propose Tail-Optimized
LRU (T-LRU), a simple adaptation of LRU that ... evicts the part of each conversation's cache
that will not reduce the next turn's TTFT below the latency threshold"; P90 TTFT −27.5 % on
WildChat) and the statement that SGLang's implementation quotes (SGLang 0.5.23,
`sglang/srt/mem_cache/evict_policy.py`, `TLRUStrategy`; this repository holds no copy of the
paper itself):

    A conversation with history length L whose next prompt is expected to add Q_hat tokens
    only has to keep L + Q_hat - threshold tokens cached to hold its next prefill under the
    TTFT budget; tokens past that budget cannot improve tail latency and are "TEL-safe",
    i.e. free to evict. ... the existing eviction driver then drains them before anything
    else (the paper's phase 1) and continues in plain recency order once they run out
    (phase 2).

The paper states the threshold ξ and the next prompt Q̂ in blocks, as here. In block terms: a
request that releases a chain of L blocks (its history: prompt and reply, the blocks it
cached) keeps blocks at depth < max(L + Q̂ − ξ, 0); its blocks at depth ≥ that budget are
TEL-safe. Phase 1 evicts TEL-safe blocks least recently released first; phase 2 the others
the same way. Both phases are LRU queues, so every operation is O(1).

L is the releasing request's own chain, the paper's per-conversation history: a block takes
the safety its latest release gives it. `eviction/sglang_tlru.py` keeps SGLang's variant, where
L is the high-water depth of every chain through the block. With ξ ≤ Q̂ nothing is TEL-safe
and T-LRU is LRU (SGLang's defaults, ξ = Q̂ = 0); the replay fits Q̂ and ξ on the training
part (`lpc.replay.fitted_policies`). A release comes in up to two calls (`push_cached`, then
`note_shared_release`, one `Release` object): L counts the blocks of both, and the blocks of
the first call move to the queue the complete L gives them.

What it cannot see inside a prefix cache: the next prompt's real length (Q̂ is one number for
every turn) and whether the conversation returns at all (T-LRU optimises the tail latency of
the turns that come; a conversation that ended keeps its budget).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from eviction.base import Evictor, FreedBlocks, Release
from eviction.linked_list import BlockList


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
        self._release: Release | None = None
        self._release_blocks = 0  # L of the release being processed
        self._release_freed: list[int] = []  # its blocks freed by the first call

    def budget(self, history_blocks: int) -> int:
        """Blocks of a chain of `history_blocks` the next turn needs cached: L + Q̂ − ξ."""
        return max(history_blocks + self.next_prompt_blocks - self.threshold_blocks, 0)

    def is_tel_safe(self, block_id: int) -> bool:
        return self._depth[block_id] >= self.budget(self._history[block_id])

    def _history_for(self, block_id: int, release_blocks: int) -> int:
        """The L that decides a released block's safety (here: its releasing chain's)."""
        return release_blocks

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

    def _place(self, block_id: int) -> None:
        self._history[block_id] = self._history_for(block_id, self._release_blocks)
        (self._safe if self.is_tel_safe(block_id) else self._rest).append(block_id)

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        if self._begin(freed, release):
            self._requeue_freed()
        depth = self._depth
        for block_id, block_depth in zip(freed.block_ids, freed.depths, strict=True):
            depth[block_id] = block_depth
            self._place(block_id)
        self._release_freed.extend(freed.block_ids)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        if self._begin(freed, release):
            self._requeue_freed()
        for block_id, block_depth in zip(freed.block_ids, freed.depths, strict=True):
            self._depth[block_id] = block_depth
            self._note_shared(block_id)

    def _note_shared(self, block_id: int) -> None:
        """A block in use was released by one of its requests (nothing to queue here)."""
        return None

    def _requeue_freed(self) -> None:
        """The release's L grew: its freed blocks still free take their places again, in
        their release order (ahead of nothing released later: they are the newest)."""
        for block_id in self._release_freed:
            if block_id in self._safe:
                self._safe.remove(block_id)
            elif block_id in self._rest:
                self._rest.remove(block_id)
            else:
                continue  # hit or evicted since
            self._place(block_id)

    # -- the evictor contract -------------------------------------------------------------
    def reset(self, block_ids: Iterable[int]) -> None:
        self._uncached.clear_to(block_ids)
        self._safe.clear_to(())
        self._rest.clear_to(())
        self._clear()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            self._forget(block_id)
        self._uncached.prepend_n(block_ids)

    def _forget(self, block_id: int) -> None:
        self._history[block_id] = 0

    def remove(self, block_id: int) -> None:
        if block_id in self._safe:
            self._safe.remove(block_id)
        elif block_id in self._rest:
            self._rest.remove(block_id)
        else:
            self._uncached.remove(block_id)

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        if n > len(self):
            raise IndexError(f"cannot pop {n} blocks: only {len(self)} are free")
        out = self._uncached.pop_n(min(n, self._uncached.size))
        for queue in (self._safe, self._rest):
            take = min(n - len(out), queue.size)
            for block_id in queue.pop_n(take):
                self._forget(block_id)
                out.append(block_id)
        return out

    def __len__(self) -> int:
        return self._uncached.size + self._safe.size + self._rest.size

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._uncached or block_id in self._safe or block_id in self._rest

    def free_block_ids(self) -> list[int]:
        return [*self._uncached, *self._safe, *self._rest]

    def check_invariants(self) -> None:
        Evictor.check_invariants(self)
        for queue in (self._uncached, self._safe, self._rest):
            queue.check_invariants()
        for block_id in self._safe:
            assert self.is_tel_safe(block_id), f"{self.name}: block {block_id} is not TEL-safe"
        for block_id in self._rest:
            assert not self.is_tel_safe(block_id), f"{self.name}: TEL-safe block {block_id} waits"
