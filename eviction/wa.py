"""WA: workload-aware eviction; one LRU queue per request category, and the queue head least
likely to be reused in the coming window goes first.

Wang et al., USENIX ATC'25, and its vLLM port, PR #22236 (closed unmerged). (p_c, λ_c) per
category come from the replay's training part (`lpc.replay.fitted_policies.fit_wa`); W is the
running mean age of the blocks the cache evicts.

The model, the sources quoted and the block-manager events: docs/design.md, "KV-cache
baselines: WA, SAE, LHD, session-ref" (**WA**) and "WA's source".
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar

from eviction.base import Evictor, FreedBlocks, Release, check_probability, dry_run_copy
from eviction.linked_list import BlockList

# Unfitted defaults (contract tests, the microbenchmark): LPC's fallback p and decay scale.
DEFAULT_REUSE_PROBABILITY = 0.5
DEFAULT_REUSE_RATE_PER_S = 1e-2
DEFAULT_WINDOW_WEIGHT = 0.01

Category = str | None


def reuse_probability(p: float, rate_per_s: float, idle_s: float, window_s: float) -> float:
    """P(reused within `window_s` | not reused in the `idle_s` since release), model above."""
    if p <= 0.0:
        return 0.0
    within = 1.0 if window_s == math.inf else -math.expm1(-rate_per_s * window_s)
    if p >= 1.0:
        return within  # memoryless: every block comes back, at rate λ
    stay = p * math.exp(-rate_per_s * max(idle_s, 0.0))
    return within * stay / (1.0 - p + stay)


def check_parameters(p: float, rate_per_s: float, what: str) -> None:
    check_probability(p, f"{what} reuse probability")
    if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, int | float):
        raise ValueError(f"{what} reuse rate must be a number, got {rate_per_s!r}")
    if not (math.isfinite(rate_per_s) and rate_per_s > 0.0):
        raise ValueError(f"{what} reuse rate must be finite and > 0 per second, got {rate_per_s!r}")


class WAEvictor(Evictor):
    """Uncached blocks in a list, then one OrderedDict per category (its LRU queue, head
    first); a pop scores each queue's head."""

    name: ClassVar[str] = "wa"

    def __init__(
        self,
        num_blocks: int,
        categories: Mapping[str, tuple[float, float]] | None = None,
        default: tuple[float, float] = (DEFAULT_REUSE_PROBABILITY, DEFAULT_REUSE_RATE_PER_S),
        window_weight: float = DEFAULT_WINDOW_WEIGHT,
    ) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        check_parameters(*default, "default")
        for category, (p, rate) in (categories or {}).items():
            check_parameters(p, rate, f"category {category!r}")
        if not 0.0 < window_weight <= 1.0:
            raise ValueError(f"window_weight must be in (0, 1], got {window_weight!r}")
        self._num_blocks = num_blocks
        self.parameters: dict[Category, tuple[float, float]] = {
            c: (float(p), float(r)) for c, (p, r) in (categories or {}).items()
        }
        self.default = (float(default[0]), float(default[1]))
        self.window_weight = window_weight
        self._uncached = BlockList(num_blocks)
        self._clear()

    def _clear(self) -> None:
        n = self._num_blocks
        self._queues: dict[Category, OrderedDict[int, None]] = {}  # non-empty queues only
        self._category: list[Category] = [None] * n
        self._queued = [False] * n
        self._released_s = [0.0] * n
        self._seq = [0] * n
        self._next_seq = 0
        self._num_queued = 0
        self._clock_s = 0.0  # the latest time seen (free_block_ids' default now)
        self.window_s = math.inf

    # -- the evictor contract -------------------------------------------------------------
    def reset(self, block_ids: Iterable[int]) -> None:
        self._uncached.clear_to(block_ids)
        self._clear()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        self._uncached.prepend_n(block_ids)

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        category = release.category
        queue = self._queues.get(category)
        if queue is None:
            queue = self._queues[category] = OrderedDict()
        time_s = release.time_s
        if time_s > self._clock_s:
            self._clock_s = time_s
        seq = self._next_seq
        cat, queued, released, seqs = self._category, self._queued, self._released_s, self._seq
        for block_id in freed.block_ids:
            queue[block_id] = None
            cat[block_id] = category
            queued[block_id] = True
            released[block_id] = time_s
            seqs[block_id] = seq
            seq += 1
        self._next_seq = seq
        self._num_queued += len(freed.block_ids)
        if not queue:
            del self._queues[category]

    def remove(self, block_id: int) -> None:
        if not self._queued[block_id]:
            self._uncached.remove(block_id)
            return
        category = self._category[block_id]
        queue = self._queues[category]
        del queue[block_id]
        if not queue:
            del self._queues[category]
        self._queued[block_id] = False
        self._num_queued -= 1

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        uncached = self._uncached
        from_uncached = min(n, uncached.size)
        if n > from_uncached + self._num_queued:
            raise IndexError(f"cannot pop {n} blocks: only {len(self)} are free")
        out = uncached.pop_n(from_uncached)
        if now_s > self._clock_s:
            self._clock_s = now_s
        if n > from_uncached:
            out += self._evict_many(n - from_uncached, now_s)
        return out

    def _evict(self, now_s: float) -> int:
        return self._evict_many(1, now_s)[0]

    def _head_terms(
        self, category: Category, queue: OrderedDict[int, None], now_s: float
    ) -> tuple[int, float, float, float, float]:
        """A queue head's part of `reuse_probability` that a pop at `now_s` does not change:
        (head, p, λ, p·e^(−λ·t), 1 − p + p·e^(−λ·t)), t its idle time."""
        head = next(iter(queue))
        p, rate = self.parameters.get(category, self.default)
        if p <= 0.0 or p >= 1.0:
            return head, p, rate, 0.0, 1.0
        stay = p * math.exp(-rate * max(now_s - self._released_s[head], 0.0))
        return head, p, rate, stay, 1.0 - p + stay

    def _evict_many(self, count: int, now_s: float) -> list[int]:
        """`count` evictions at `now_s`, each of the queue head of lowest P (ties: older
        release, then earlier push), the window moving after each. A head's idle-time terms
        are computed once per pop (`_head_terms`), and only the window's factor per eviction:
        the operations of `reuse_probability`, in its order, so the same P to the bit."""
        released, seqs, queues = self._released_s, self._seq, self._queues
        heads = {c: self._head_terms(c, queue, now_s) for c, queue in queues.items()}
        assert len(heads) > 0 or count == 0, "wa: evict called with no queued block"
        inf, expm1, w = math.inf, math.expm1, self.window_weight
        out = []
        for _ in range(count):
            window = self.window_s
            best_category: Category = None
            best_p = best_r = 0.0
            best_s = -1
            for category, (head, p, rate, stay, denominator) in heads.items():
                if p <= 0.0:
                    reuse = 0.0
                else:
                    within = 1.0 if window == inf else -expm1(-rate * window)
                    reuse = within if p >= 1.0 else within * stay / denominator
                r = released[head]
                if best_s < 0 or (
                    reuse < best_p
                    or (reuse == best_p and (r < best_r or (r == best_r and seqs[head] < best_s)))
                ):
                    best_category, best_p, best_r, best_s = category, reuse, r, seqs[head]
            assert best_s >= 0, "wa: evict called with no queued block"
            queue = queues[best_category]
            victim, _ = queue.popitem(last=False)
            if queue:
                heads[best_category] = self._head_terms(best_category, queue, now_s)
            else:
                del queues[best_category]
                del heads[best_category]
            self._queued[victim] = False
            self._num_queued -= 1
            age = max(now_s - released[victim], 0.0)
            self.window_s = age if window == inf else (1.0 - w) * window + w * age
            out.append(victim)
        return out

    def __len__(self) -> int:
        return self._uncached.size + self._num_queued

    def __contains__(self, block_id: object) -> bool:
        if not isinstance(block_id, int) or not 0 <= block_id < self._num_blocks:
            return False
        # `in self._uncached` past the checks just made
        return self._queued[block_id] or self._uncached._nodes[block_id].prev is not None

    def free_block_ids(self, now_s: float | None = None) -> list[int]:
        """The pop order at `now_s` (default: the latest time seen): uncached blocks, then a
        dry run of evictions on a copy (each eviction moves the window). O(n), for tests."""
        now = self._clock_s if now_s is None else now_s
        dry = dry_run_copy(self)
        return [*self._uncached, *(dry._evict(now) for _ in range(self._num_queued))]

    def check_invariants(self) -> None:
        Evictor.check_invariants(self)
        self._uncached.check_invariants()
        members = [b for queue in self._queues.values() for b in queue]
        assert len(members) == len(set(members)), "wa: a block is in two queues"
        assert len(members) == self._num_queued == sum(self._queued), (
            "wa: the queued count is out of sync with the queues"
        )
        for category, queue in self._queues.items():
            assert queue, f"wa: category {category!r} keeps an empty queue"
            previous = -1
            for block_id in queue:
                assert self._queued[block_id], f"wa: block {block_id} queued but not marked"
                assert self._category[block_id] == category, (
                    f"wa: block {block_id} is in queue {category!r} but tagged "
                    f"{self._category[block_id]!r}"
                )
                assert block_id not in self._uncached, f"wa: block {block_id} also uncached"
                assert self._seq[block_id] > previous, f"wa: queue {category!r} is out of order"
                previous = self._seq[block_id]
        assert self.window_s >= 0.0, f"wa: the window is {self.window_s!r}"
