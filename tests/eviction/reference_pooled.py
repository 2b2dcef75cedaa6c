"""A brute-force `lpc-pooled` evictor written straight from its definition, for differential tests.

It keeps every release of every content (no memory window as a data structure, no judging
queue) and, per block, the probability its last release gave it and that release's time; at
every eviction it recomputes every free block's decayed probability
p·d / (p·d + 1 − p), d = exp(−scale·(now − t)) — no static keys, no heap. p_shared at a
release is recomputed from the whole history: shared releases older than the horizon, and
whether the same content was released again within the horizon after each. The trust gate
is recomputed the same way: every predicted release of a conversation older than the horizon,
in time order, labelled by whether that conversation released again within the horizon,
scores the model's and the running constant's log-loss from scratch.

With `memory="blocks"` nothing is remembered per content: a block is shared only through its
own metadata (which an eviction drops), and each block keeps the releases of its current
content (an eviction starts a new list). A shared release is judged at the block's first
strictly later release (reused if that comes within the horizon and the block still holds the
content) or once it is older than the horizon; a block's shared releases at one instant are
one.

With `memory="chains"` a block is shared through its own metadata as with the memory by block,
and also when it is among a release's top blocks that the last release under the same top
hash (within the window) shares from the top, compared hash by hash: all of them if that
release was another conversation's, else as many as that release shared from its top. Each
release with a top stretch of shared blocks counts them as judged once older than the horizon,
and as reused as far as the last release under the same top up to the horizon's end (and
strictly later) shares that prefix.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from eviction import Evictor, FreedBlocks, Release, decayed_probability
from tests.eviction.reference import leaves, link_chain

FLOOR = 1e-6


def _clamp(p: float) -> float:
    return min(max(p, FLOOR), 1.0 - FLOOR)


@dataclass
class _Metadata:
    probability: float  # the block's probability at `time_s`
    time_s: float
    tag: object  # the conversation of its releases, or SHARED once two conversations did


@dataclass(frozen=True)
class _Released:
    conversation_id: str | None
    time_s: float
    shared: bool


@dataclass(frozen=True)
class _ChainReleased:
    conversation_id: str | None
    time_s: float
    hashes: tuple  # tail first: the top block's hash last
    shared: int  # how many top blocks it released as shared


def _common_top(a: Sequence, b: Sequence) -> int:
    """How many hashes two tail-first lists share from their top, compared one by one."""
    k = 0
    while k < min(len(a), len(b)) and a[-1 - k] is not None and a[-1 - k] == b[-1 - k]:
        k += 1
    return k


SHARED = object()


class BruteForcePooledLPC(Evictor):
    name = "lpc-pooled-reference"

    def __init__(
        self,
        num_blocks: int,
        scale_per_s: float = 1e-2,
        fallback_probability: float = 0.5,
        memory_window_s: float = 600.0,
        horizon_s: float = 180.0,
        model_min_labels: int | None = 100,
        model_margin_nats: float = 0.0,
        memory: str = "content",
    ) -> None:
        self.memory = memory
        # The memory by block: each block's contents so far (its evictions), and the releases
        # of each (block, content) in order.
        self.epoch: dict[int, int] = {}
        self.block_history: dict[tuple[int, int], list[_Released]] = {}
        self.scale = scale_per_s
        self.fallback = fallback_probability
        self.window = memory_window_s
        self.horizon = horizon_s
        self.uncached: list[int] = []
        self.metadata: dict[int, _Metadata] = {}
        self.free: dict[int, tuple[int, int]] = {}  # cached free block -> (depth, push order)
        self.parent: dict[int, int] = {}  # cached block -> its parent block (prefix closure)
        self.history: dict[Hashable, list[_Released]] = {}  # content -> its releases, in order
        self.order = 0
        self.min_labels = model_min_labels
        self.margin = model_margin_nats
        self.predicted: list[tuple[float, str, float]] = []  # (time, conversation, p)
        # The memory by chain: top hash -> its releases, in order.
        self.chains: dict[Hashable, list[_ChainReleased]] = {}

    def reset(self, block_ids: Iterable[int]) -> None:
        self.uncached = list(block_ids)
        self.metadata.clear()
        self.free.clear()
        self.parent.clear()
        self.history.clear()
        self.predicted.clear()
        self.epoch.clear()
        self.block_history.clear()
        self.chains.clear()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        self.uncached[0:0] = list(block_ids)

    def shared_probability(self, now_s: float) -> float:
        """(reused + 0.5) / (judged + 1) over the shared releases older than the horizon."""
        judged = reused = 0
        horizon = self.horizon
        for releases in self.history.values():
            for i, r in enumerate(releases):
                if not r.shared or not r.time_s < now_s - horizon:
                    continue
                judged += 1
                start, end = r.time_s, r.time_s + horizon
                for later in releases[i + 1 :]:
                    if start < later.time_s <= end:
                        reused += 1
                        break
        return (reused + 0.5) / (judged + 1)

    def block_shared_probability(self, now_s: float) -> float:
        """p_shared with the memory by block, the releases up to `now_s` included."""
        judged = reused = 0
        horizon = self.horizon
        for (block_id, epoch), releases in self.block_history.items():
            shared_times = sorted({r.time_s for r in releases if r.shared})
            for t in shared_times:
                later = [r.time_s for r in releases if t < r.time_s <= now_s]
                moved_on = any(
                    t < r.time_s <= now_s
                    for (b, e), others in self.block_history.items()
                    if b == block_id and e > epoch
                    for r in others
                )
                if later and min(later) <= t + horizon:
                    judged += 1
                    reused += 1
                elif t < now_s - horizon or moved_on:
                    judged += 1
        return (reused + 0.5) / (judged + 1)

    def chain_shared_probability(self, now_s: float) -> float:
        """p_shared with the memory by chain, over the releases older than the horizon."""
        judged = reused = 0
        for releases in self.chains.values():
            for r in releases:
                if not r.shared or not r.time_s < now_s - self.horizon:
                    continue
                judged += r.shared
                upto = [x for x in releases if x.time_s <= r.time_s + self.horizon]
                if upto[-1].time_s > r.time_s:
                    reused += min(r.shared, _common_top(upto[-1].hashes, r.hashes))
        return (reused + 0.5) / (judged + 1)

    def _chain_known(self, hashes: Sequence, conv: str | None, now_s: float) -> int:
        """How many of a release's top blocks the memory by chain knows as shared."""
        releases = self.chains.get(hashes[-1]) if hashes and hashes[-1] is not None else None
        if not releases or now_s - releases[-1].time_s > self.window:
            return 0
        last = releases[-1]
        common = _common_top(last.hashes, hashes)
        return common if last.conversation_id != conv else min(common, last.shared)

    def model_trusted(self, now_s: float) -> bool:
        """Whether the model's log-loss on the releases judged by now is at most the
        constant's (the running continued share, one pseudo-release at 0.5) minus the margin."""
        if self.min_labels is None:
            return True
        judged = continued = 0
        model_loss = constant_loss = 0.0
        times_of: dict[str, list[float]] = {}  # conversation -> its release times
        for t, c, _ in self.predicted:
            times_of.setdefault(c, []).append(t)
        for time_s, conv, p in sorted(self.predicted, key=lambda r: r[0]):
            if not time_s < now_s - self.horizon:
                continue
            end = time_s + self.horizon
            y = False
            for t in times_of[conv]:
                if time_s < t <= end:
                    y = True
                    break
            constant = (continued + 0.5) / (judged + 1)
            p = min(max(p, 1e-3), 1.0 - 1e-3)
            model_loss -= math.log(p if y else 1.0 - p)
            constant_loss -= math.log(constant if y else 1.0 - constant)
            judged += 1
            continued += y
        return judged >= self.min_labels and model_loss <= constant_loss - self.margin * judged

    def _record(self, freed: FreedBlocks, release: Release) -> None:
        now = release.time_s
        predicted = release.probability
        if predicted is not None and not self.model_trusted(now):
            predicted = None
        conv = release.conversation_id
        if (
            release.probability is not None
            and conv is not None
            and (now, conv) not in {(t, c) for t, c, _ in self.predicted}
        ):
            self.predicted.append((now, conv, release.probability))
        p = _clamp(self.fallback if predicted is None else predicted)
        by_content = self.memory == "content"
        by_chain = self.memory == "chains"
        known = 0
        if by_content:
            p_shared = _clamp(self.shared_probability(now))
        elif by_chain:
            p_shared = _clamp(self.chain_shared_probability(now))
            known = self._chain_known(freed.hashes, conv, now)
        else:  # this release judges the shared releases it follows: listed first
            placed = []
            for block_id in freed.block_ids:
                releases = self.block_history.setdefault(
                    (block_id, self.epoch.get(block_id, 0)), []
                )
                releases.append(_Released(conv, now, False))
                placed.append(releases)
            p_shared = _clamp(self.block_shared_probability(now))
        n = len(freed.block_ids)
        shared_at = []
        for k, (block_id, block_hash) in enumerate(zip(freed.block_ids, freed.hashes, strict=True)):
            shared = by_chain and k >= n - known
            if by_content and block_hash is not None and self.history.get(block_hash):
                last = self.history[block_hash][-1]
                shared = now - last.time_s <= self.window and (
                    last.shared or last.conversation_id != conv
                )
            old = self.metadata.get(block_id)
            if old is None or (conv is not None and old.tag == conv):
                q = p
            else:
                old_now = decayed_probability(old.probability, now - old.time_s, self.scale)
                q = _clamp(1.0 - (1.0 - old_now) * (1.0 - p))
                shared = True
            if shared:
                q = max(q, p_shared)
            self.metadata[block_id] = _Metadata(q, now, SHARED if shared else conv)
            shared_at.append(shared)
            if not by_content and not by_chain:
                placed[k][-1] = _Released(conv, now, shared)
            elif block_hash is not None:
                self.history.setdefault(block_hash, []).append(_Released(conv, now, shared))
        if by_chain and n and freed.hashes[-1] is not None:
            top = 0
            while top < n and shared_at[n - 1 - top]:
                top += 1
            self.chains.setdefault(freed.hashes[-1], []).append(
                _ChainReleased(conv, now, tuple(freed.hashes), top)
            )

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        if not freed.block_ids:
            return
        self._record(freed, release)
        link_chain(self.parent, freed)
        for block_id, depth in zip(freed.block_ids, freed.depths, strict=True):
            self.free[block_id] = (depth, self.order)
            self.order += 1

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        self._record(freed, release)

    def remove(self, block_id: int) -> None:
        if block_id in self.free:
            del self.free[block_id]
        else:
            self.uncached.remove(block_id)

    def value(self, block_id: int, now_s: float) -> float:
        m = self.metadata[block_id]
        return decayed_probability(m.probability, now_s - m.time_s, self.scale)

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
            del self.metadata[victim]
            self.epoch[victim] = self.epoch.get(victim, 0) + 1  # its content is gone
            self.parent.pop(victim, None)
            out.append(victim)
        return out

    def __len__(self) -> int:
        return len(self.uncached) + len(self.free)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self.free or block_id in self.uncached

    def free_block_ids(self) -> list[int]:
        return [*self.uncached, *self.free]
