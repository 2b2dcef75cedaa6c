"""LPC: evict the cached block whose conversation is least likely to come back, right now.

The paper's decayed probability is ordered by the static key logit(p) + scale·t_last, so a
plain heap on it is exact at every instant; max pooling over conversations sharing a block.
A release without a prediction, or with a NaN p, takes the fallback p; any other p is clamped
to [floor, 1 − floor], so no key is ever NaN.

Why: docs/design.md, "LPC's key".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import groupby, repeat
from typing import ClassVar

from eviction.base import FreedBlocks, Release, check_probability
from eviction.priority import PriorityEvictor
from eviction.run_heap import Run

DEFAULT_SCALE_PER_S = 1e-2
DEFAULT_FALLBACK_PROBABILITY = 0.5
DEFAULT_PROBABILITY_FLOOR = 1e-6


def static_key(
    probability: float,
    time_s: float,
    scale_per_s: float,
    floor: float,
    fallback: float = DEFAULT_FALLBACK_PROBABILITY,
) -> float:
    """logit(clamp(p)) + scale·t: orders blocks exactly as the paper's decayed probability.

    A NaN p carries no information and takes `fallback`, as the evictors give it their own
    fallback p; any other p, ±inf included, is clamped to [floor, 1 − floor]: no key is NaN.
    """
    if probability != probability:  # NaN
        probability = fallback
    p = min(max(probability, floor), 1.0 - floor)
    return math.log(p / (1.0 - p)) + scale_per_s * time_s


def decayed_probability(probability: float, elapsed_s: float, scale_per_s: float) -> float:
    """The paper's p·d / (p·d + 1 − p) with d = exp(−scale·elapsed)."""
    d = math.exp(-scale_per_s * elapsed_s)
    return probability * d / (probability * d + 1.0 - probability)


SHARED = "<shared>"  # run tag of blocks released by more than one conversation
NO_TAG = object()  # equal to no tag: what an anonymous release compares blocks' tags with


class LPCEvictor(PriorityEvictor):
    """Min-heap on the static key, with max pooling across conversations."""

    name: ClassVar[str] = "lpc"
    prefix_closed: ClassVar[bool] = True  # leaves first (eviction.run_heap)

    def __init__(
        self,
        num_blocks: int,
        scale_per_s: float = DEFAULT_SCALE_PER_S,
        fallback_probability: float = DEFAULT_FALLBACK_PROBABILITY,
        probability_floor: float = DEFAULT_PROBABILITY_FLOOR,
    ) -> None:
        if not math.isfinite(scale_per_s) or scale_per_s < 0:
            raise ValueError(f"scale_per_s must be a finite number >= 0, got {scale_per_s!r}")
        check_probability(fallback_probability, "fallback_probability")
        if not 0.0 < probability_floor < 0.5:
            raise ValueError(f"probability_floor must be in (0, 0.5), got {probability_floor!r}")
        self.scale_per_s = scale_per_s
        self.fallback_probability = fallback_probability
        self.probability_floor = probability_floor
        self.fallbacks_used = 0
        # The highest logit any key was given so far, as logit(p) at its own time: every key
        # ever assigned is at most top_logit + scale·(its time), so a key of
        # top_logit + scale·now ranks after every block queued by now (`push_protected`).
        # It starts at the fallback p's logit, the key of a release that knows nothing.
        q = min(max(fallback_probability, probability_floor), 1.0 - probability_floor)
        self.top_logit = math.log(q / (1.0 - q))
        super().__init__(num_blocks)

    def key_for(self, release: Release) -> float:
        """The static key a release gives its blocks (fallback p when none was predicted)."""
        p = release.probability
        if p is None or p != p:  # none predicted, or NaN: the fallback p
            self.fallbacks_used += 1
            p = self.fallback_probability
        return static_key(p, release.time_s, self.scale_per_s, self.probability_floor)

    def _pooled(
        self, block_ids: Sequence[int], key: float, conversation_id: str | None
    ) -> tuple[list[float], list[str | None]]:
        """Per-block (key, tag) after this release: max pooling across conversations. One
        computation per stretch of blocks with the same metadata (the run or ghost a chain's
        blocks left together), the lists filled by C-level passes."""
        keys: list[float] = []
        tags: list[str | None] = []
        for old, stretch in groupby(map(self._state.__getitem__, block_ids)):
            k = len(list(stretch))
            if old is None or (conversation_id is not None and old.tag == conversation_id):
                keys += repeat(key, k)
                tags += repeat(conversation_id, k)
            else:
                keys += repeat(old.key if old.key > key else key, k)
                tags += repeat(SHARED, k)
        return keys, tags

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        block_ids = freed.block_ids
        if not block_ids:
            return
        # key_for(release), inlined: its two frames (key_for, static_key) and min/max calls
        # are 5.1 % of the block operation on `lpc bench evictor` (callgrind, default plan:
        # 706 against 744 instructions per operation). The brute-force reference tests pin
        # the two copies to the same victims.
        p = release.probability
        if p is None or p != p:  # none predicted, or NaN: the fallback p
            self.fallbacks_used += 1
            p = self.fallback_probability
        floor = self.probability_floor
        p = floor if p < floor else (1.0 - floor if p > 1.0 - floor else p)
        logit = math.log(p / (1.0 - p))
        if logit > self.top_logit:
            self.top_logit = logit
        key = logit + self.scale_per_s * release.time_s
        conversation_id = release.conversation_id
        # An anonymous release owns no block: its tag matches none.
        own_tag = NO_TAG if conversation_id is None else conversation_id
        run = self._new_run(key, conversation_id, block_ids, freed.depths)
        # Fast path: blocks cached for the first time, or released again by their only
        # conversation, all take this release's key and form a single run.
        if self._claim(block_ids, run, own_tag, freed.index):
            self._enqueue(run)
            if freed.chain:
                self._link_runs([run], freed.parent_id)
            return
        # Some block is shared: pool block by block.
        keys, tags = self._pooled(block_ids, key, conversation_id)
        runs = self._push_grouped(block_ids, freed.depths, keys, tags)
        if freed.chain:
            self._link_runs(runs, freed.parent_id)

    def push_cached_each(self, freed: FreedBlocks, release: Release) -> None:
        """`push_cached` of each block alone, in the given order (any depths), all with the
        same release, in one call: vLLM's CPU tier makes its chunks evictable one call at a
        time and hands them over in batches (`lpc.integrations.vllm_cache_policy`).

        The same keys, tags and eviction order as the single pushes: a block's key and tag
        depend only on the release and the block's own metadata, and the heap orders blocks
        by (key, −depth, push). Queued deepest first (a stable sort) as runs pushed in list
        order, two blocks of equal key and depth keep the given order, as single pushes
        would; `fallbacks_used` counts one per block as they would."""
        block_ids = freed.block_ids
        n = len(block_ids)
        if n <= 1:
            self.push_cached(freed, release)
            return
        # As push_cached computes it, so that top_logit and the keys are the same floats.
        p = release.probability
        if p is None or p != p:
            self.fallbacks_used += n
            p = self.fallback_probability
        floor = self.probability_floor
        p = floor if p < floor else (1.0 - floor if p > 1.0 - floor else p)
        logit = math.log(p / (1.0 - p))
        if logit > self.top_logit:
            self.top_logit = logit
        keys, tags = self._pooled(
            block_ids, logit + self.scale_per_s * release.time_s, release.conversation_id
        )
        self._push_deepest_first(freed, keys, tags)

    def push_protected_each(self, freed: FreedBlocks, release: Release) -> None:
        """`push_protected` of each block alone, in the given order, all with the same
        release, in one call (as `push_cached_each`, and exact for the same reasons: the
        protected key reads `top_logit`, which a protected push does not change)."""
        if len(freed.block_ids) <= 1:
            self.push_protected(freed, release)
            return
        keys, tags = self._pooled(
            freed.block_ids, self.protected_key(release.time_s), release.conversation_id
        )
        self._push_deepest_first(freed, keys, tags)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        key = self.key_for(release)
        self.top_logit = max(self.top_logit, key - self.scale_per_s * release.time_s)
        keys, tags = self._pooled(freed.block_ids, key, release.conversation_id)
        self._remember_grouped(freed.block_ids, keys, tags)

    def protected_key(self, time_s: float) -> float:
        """A key that ranks after every block queued by `time_s`: the highest logit given so
        far, at that time. With one p for every release it is that p's key, LRU's place."""
        return self.top_logit + self.scale_per_s * time_s

    def push_protected(self, freed: FreedBlocks, release: Release) -> None:
        """Queue the blocks of a request that is not finished (preempted): it will ask for
        them again as soon as it is rescheduled, so they go after every block queued so far,
        as LRU queues them last. The release's p is not used and nothing is learned from it
        (no prediction, no pooling memory, no label); blocks released later rank by their
        own keys, as after LRU's tail. A block others released too keeps the larger key."""
        block_ids = freed.block_ids
        if not block_ids:
            return
        keys, tags = self._pooled(
            block_ids, self.protected_key(release.time_s), release.conversation_id
        )
        runs = self._push_grouped(block_ids, freed.depths, keys, tags)
        if freed.chain:
            self._link_runs(runs, freed.parent_id)

    def note_protected_release(self, freed: FreedBlocks, release: Release) -> None:
        """`push_protected` for cached blocks the preempted request gives up while other
        requests still hold them: their metadata takes the protected key (max-pooled)."""
        keys, tags = self._pooled(
            freed.block_ids, self.protected_key(release.time_s), release.conversation_id
        )
        self._remember_grouped(freed.block_ids, keys, tags)

    def requeue(self, freed: FreedBlocks) -> None:
        """Queue blocks taken out of the queue (`remove`) again, each with the key and tag its
        last release gave it, as if it had never left: nothing is released, pooled or learned.
        A key is static (the module), so it is still the block's place. vLLM's CPU tier
        (`lpc.integrations.vllm_cache_policy`) puts back so the chunks a store protects and
        those a load pinned: neither is a release, and pushing the last release again would
        pool it with itself (`lpc-pooled`: OR pooling raises a shared block's key at every
        push) and record it again (its trust gate's labels, its hash memory)."""
        state = self._state
        keys: list[float] = []
        tags: list[str | None] = []
        for block_id in freed.block_ids:
            ghost = state[block_id]
            if ghost is None or type(ghost) is Run:
                raise ValueError(f"block {block_id} is queued or holds no release to go back to")
            keys.append(ghost.key)
            tags.append(ghost.tag)
        self._push_deepest_first(freed, keys, tags)

    def own_runs(self, freed: FreedBlocks) -> list[Run]:
        """The runs that hold blocks just pushed (`push_cached`) under their release alone,
        not pooled with another conversation's: what a prediction that arrives after the
        release re-keys (`rekey_late`). Read right after the push (a C-level pass)."""
        runs = set(map(self._state.__getitem__, freed.block_ids))
        return [run for run in runs if type(run) is Run and run.tag != SHARED]

    def late_key(self, release: Release) -> float | None:
        """The key a prediction that arrived after its release gives that release's own
        runs (its p, clamped, at the release's time); None keeps the key they have."""
        p = release.probability
        if p is None or p != p:
            return None
        floor = self.probability_floor
        p = floor if p < floor else (1.0 - floor if p > 1.0 - floor else p)
        logit = math.log(p / (1.0 - p))
        if logit > self.top_logit:
            self.top_logit = logit
        return logit + self.scale_per_s * release.time_s

    def rekey_late(self, runs: Sequence[Run], release: Release) -> int:
        """Re-key a release's own runs (`own_runs`, queued at the fallback p when it had no
        prediction yet) with the prediction that came later (`release.probability`): one heap
        push per run still queued, as if the prediction had come in time. Blocks it shared
        with other conversations keep their pooled key, and blocks released since by a
        newer release, or held back for prefix closure, keep theirs. Returns the runs
        re-keyed."""
        key = self.late_key(release)
        if key is None:
            return 0
        return sum(self._rekey_run(run, key) for run in runs if run.key != key)

    def pooled_key(self, block_id: int) -> float | None:
        """The block's current static key (None when it holds no pooled metadata)."""
        metadata = self._state[block_id]
        return None if metadata is None else metadata.key
