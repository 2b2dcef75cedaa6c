"""LPC: evict the cached block whose conversation is least likely to come back, right now.

The paper's decayed probability p_cur = p·d / (p·d + 1 − p), d = exp(−scale·(now − t_last)),
satisfies logit(p_cur) = logit(p) − scale·(now − t_last). The shift scale·now is the same for
every block, so ordering blocks by p_cur at any instant is ordering them by the static key

    k = logit(p) + scale·t_last,

which never changes while a block waits. A plain heap on k is therefore exact at every
instant, with no periodic re-evaluation. Max pooling over conversations sharing a block is
max(k_old, k_new); a block released again by its one and only conversation takes the new key,
since that conversation's newest prediction supersedes its older one.
"""

from __future__ import annotations

import math
from typing import ClassVar

from eviction.base import FreedBlocks, Release, check_probability
from eviction.priority import PriorityEvictor

DEFAULT_SCALE_PER_S = 1e-2
DEFAULT_FALLBACK_PROBABILITY = 0.5
DEFAULT_PROBABILITY_FLOOR = 1e-6


def static_key(probability: float, time_s: float, scale_per_s: float, floor: float) -> float:
    """logit(clamp(p)) + scale·t: orders blocks exactly as the paper's decayed probability."""
    p = min(max(probability, floor), 1.0 - floor)
    return math.log(p / (1.0 - p)) + scale_per_s * time_s


def decayed_probability(probability: float, elapsed_s: float, scale_per_s: float) -> float:
    """The paper's p·d / (p·d + 1 − p) with d = exp(−scale·elapsed)."""
    d = math.exp(-scale_per_s * elapsed_s)
    return probability * d / (probability * d + 1.0 - probability)


class LPCEvictor(PriorityEvictor):
    """Min-heap on the static key, with max pooling across conversations."""

    name: ClassVar[str] = "lpc"

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
        self._pooled_key: list[float | None] = [None] * num_blocks
        self._owner: list[str | None] = [None] * num_blocks
        self._shared = [False] * num_blocks
        self.fallbacks_used = 0
        super().__init__(num_blocks)

    def _forget(self, block_id: int) -> None:
        self._pooled_key[block_id] = None
        self._owner[block_id] = None
        self._shared[block_id] = False

    def key_for(self, release: Release) -> float:
        """The static key a release gives its blocks (fallback p when none was predicted)."""
        p = release.probability
        if p is None:
            self.fallbacks_used += 1
            p = self.fallback_probability
        return static_key(p, release.time_s, self.scale_per_s, self.probability_floor)

    def _pool(self, block_id: int, key: float, conversation_id: str | None) -> float:
        old = self._pooled_key[block_id]
        if old is None:
            self._owner[block_id] = conversation_id
        elif (
            self._shared[block_id]
            or conversation_id is None
            or self._owner[block_id] != conversation_id
        ):
            self._shared[block_id] = True
            key = max(old, key)
        self._pooled_key[block_id] = key
        return key

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        key = self.key_for(release)
        conversation_id = release.conversation_id
        pool, push = self._pool, self._push
        for block_id, depth in zip(freed.block_ids, freed.depths, strict=True):
            push(block_id, pool(block_id, key, conversation_id), depth)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        key = self.key_for(release)
        for block_id in freed.block_ids:
            self._pool(block_id, key, release.conversation_id)

    def pooled_key(self, block_id: int) -> float | None:
        """The block's current static key (None when it holds no pooled metadata)."""
        return self._pooled_key[block_id]
