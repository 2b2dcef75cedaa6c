"""LPC for prefixes shared across conversations: a block is worth what ANY user makes of it.

Plain LPC (static key logit(p) + scale·t, one heap, leaves first) with three changes, defined
in docs/design.md, "`lpc-pooled`'s details": OR pooling across conversations instead of max
pooling; a shared floor `p_shared` for contents another conversation released within
`memory_window_s` (by default the blocks' own metadata and one entry per release under its
top hash, `memory="chains"`, `eviction.chain_memory`; or a hash memory, `memory="content"`,
`eviction.content_memory`; or the blocks' metadata alone, `memory="blocks"`), estimated online
over the access model's horizon; and a trust gate that keys a release by its predicted p only
while the model's prequential log-loss is no worse than a constant's. Every key stays static.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from itertools import chain, groupby, repeat
from operator import itemgetter, lt, setitem
from typing import Any, ClassVar

from eviction.base import FreedBlocks, Release
from eviction.chain_memory import ChainEntry, ChainMemory, common_top
from eviction.content_memory import NO_ENTRY, ContentMemory
from eviction.lpc import (
    DEFAULT_FALLBACK_PROBABILITY,
    DEFAULT_PROBABILITY_FLOOR,
    DEFAULT_SCALE_PER_S,
    NO_TAG,
    SHARED,
    LPCEvictor,
)
from eviction.run_heap import consume

# The access model's default label horizon (training.access_defaults.DEFAULT_ACCESS_HORIZON_S).
DEFAULT_SHARED_HORIZON_S = 180.0
# How long the memory keeps a content's last release: about the longest time LRU keeps a block
# at the largest default Mooncake cache size (510 s median at 16M tokens, docs/results.md),
# so that the memory does not forget sharing the cache itself still shows.
DEFAULT_MEMORY_WINDOW_S = 600.0
# The memory holds at most this many contents per block of the pool, however busy the engine:
# its window then ends earlier. On the Mooncake traces it peaks at 37,519 contents, 7.7 times
# the pool at the smallest default size (2.5M tokens, 4,883 blocks), so 8 never binds there.
DEFAULT_MEMORY_BLOCKS_FACTOR = 8.0
SHARED_PRIOR = 0.5  # p_shared before any shared release was judged (one pseudo-release)
# The model is trusted only after this many judged releases: with fewer, a few early labels
# decide (on the synthetic Mooncake trace the gate flipped at its 1st, 4th and 5th).
DEFAULT_MODEL_MIN_LABELS = 100
DEFAULT_MODEL_MARGIN_NATS = 0.0  # the model must do at least as well as the constant
CONTINUED_PRIOR = 0.5  # the constant before any release was judged (one pseudo-release)
LOSS_PROBABILITY_CLAMP = 1e-3  # log-loss of a p clamped to [c, 1 − c]: one label costs ≤ 6.9 nats
_time_of = itemgetter(1)  # a memory entry's time
# Where `lpc-pooled` keeps what it knows of sharing: a map per content ("content", across
# evictions), each block's own metadata ("blocks", while the block holds its content), or that
# and a map per release's top block ("chains", across evictions, one entry per release).
MEMORIES = ("content", "blocks", "chains")
# The default, by the rule in docs/results.md ("`lpc-pooled`'s sharing memory kept by chain").
DEFAULT_MEMORY = "chains"
# A chain memory's shared blocks as `_keys_of` reads a memory entry: shared, at any time.
_CHAIN_SHARED = (None, math.inf, True)


class PooledLPCEvictor(LPCEvictor):
    """LPC with OR pooling across conversations and an online floor for shared prefixes."""

    name: ClassVar[str] = "lpc-pooled"

    def __init__(
        self,
        num_blocks: int,
        scale_per_s: float = DEFAULT_SCALE_PER_S,
        fallback_probability: float = DEFAULT_FALLBACK_PROBABILITY,
        probability_floor: float = DEFAULT_PROBABILITY_FLOOR,
        memory_window_s: float = DEFAULT_MEMORY_WINDOW_S,
        horizon_s: float = DEFAULT_SHARED_HORIZON_S,
        memory_blocks_factor: float = DEFAULT_MEMORY_BLOCKS_FACTOR,
        model_min_labels: int | None = DEFAULT_MODEL_MIN_LABELS,
        model_margin_nats: float = DEFAULT_MODEL_MARGIN_NATS,
        memory: str = DEFAULT_MEMORY,
    ) -> None:
        if memory not in MEMORIES:
            raise ValueError(f"memory must be one of {', '.join(MEMORIES)}, got {memory!r}")
        if not math.isfinite(horizon_s) or horizon_s <= 0:
            raise ValueError(f"horizon_s must be a finite number > 0, got {horizon_s!r}")
        if not math.isfinite(memory_window_s) or memory_window_s < horizon_s:
            raise ValueError(
                f"memory_window_s must be a finite number >= horizon_s ({horizon_s!r}), "
                f"got {memory_window_s!r}"
            )
        if not math.isfinite(memory_blocks_factor) or memory_blocks_factor <= 0:
            raise ValueError(
                f"memory_blocks_factor must be a finite number > 0, got {memory_blocks_factor!r}"
            )
        if model_min_labels is not None and model_min_labels < 0:
            raise ValueError(f"model_min_labels must be >= 0 or None, got {model_min_labels!r}")
        if not math.isfinite(model_margin_nats):
            raise ValueError(
                f"model_margin_nats must be a finite number, got {model_margin_nats!r}"
            )
        self.memory_window_s = memory_window_s
        self.model_min_labels = model_min_labels
        self.model_margin_nats = model_margin_nats
        # Releases to judge for the trust gate: (time, conversation, predicted p), oldest
        # first, and each conversation's last release (dropped once its last label is judged).
        self._labels: deque[tuple[float, str, float]] = deque()
        self._last_release_s: dict[str, float] = {}
        self.model_labels_judged = 0
        self.model_labels_continued = 0
        self.model_loss_nats = 0.0
        self.constant_loss_nats = 0.0
        self.model_trusted = model_min_labels is None or model_min_labels == 0
        self.horizon_s = horizon_s
        # The memory's size bound: contents beyond it are forgotten oldest first, as if
        # their window had ended.
        self.memory_max_entries = max(1, int(memory_blocks_factor * num_blocks))
        self.memory = memory
        self._by_content = memory == "content"
        self._by_chain = memory == "chains"
        # content hash -> (conversation of its last release, time, shared then); oldest first
        # (empty with the memory by block)
        self._memory = ContentMemory()
        # top block's hash -> its last release (the memory by chain; empty otherwise)
        self._chains = ChainMemory()
        # Shared releases to judge, oldest first: (time, the contents it released as shared),
        # by block (time, their block ids), or by chain (time, top hash, hash list, how many
        # top blocks were shared); then, by block, each block's shared release still awaiting
        # judgement (block id -> its time): only those, so a few.
        self._pending: deque[tuple[Any, ...]] = deque()
        self._pending_at: dict[int, float] = {}
        self.shared_releases_judged = 0
        self.shared_releases_reused = 0
        super().__init__(num_blocks, scale_per_s, fallback_probability, probability_floor)

    def reset(self, block_ids: Iterable[int]) -> None:
        super().reset(block_ids)
        self._memory.clear()
        self._chains.clear()
        self._pending.clear()
        self._pending_at.clear()
        self.shared_releases_judged = 0
        self.shared_releases_reused = 0
        self._labels.clear()
        self._last_release_s.clear()
        self.model_labels_judged = 0
        self.model_labels_continued = 0
        self.model_loss_nats = 0.0
        self.constant_loss_nats = 0.0
        self.model_trusted = self.model_min_labels is None or self.model_min_labels == 0

    @property
    def shared_probability(self) -> float:
        """p_shared now: the share of judged shared releases that were reused in time."""
        return (self.shared_releases_reused + SHARED_PRIOR) / (self.shared_releases_judged + 1)

    def _advance(self, now_s: float) -> None:
        """Judge the shared releases older than the horizon; forget contents past the window."""
        pending, memory = self._pending, self._memory
        cutoff = now_s - self.horizon_s
        if self._by_chain:
            chains = self._chains
            while pending and pending[0][0] < cutoff:
                time_s, top, hashes, shared = pending.popleft()
                self.shared_releases_judged += shared
                # As by content: every release up to `cutoff` was seen, none later than
                # time_s + horizon_s, so a later entry under the same top was released within
                # the horizon; its blocks are reused as far as it shares the prefix.
                entry = chains.get(top)
                if entry is not None and entry.time_s > time_s:
                    self.shared_releases_reused += min(shared, common_top(entry.hashes, hashes))
            chains.forget_before(now_s - self.memory_window_s)
            return
        if not self._by_content:
            pending_at = self._pending_at
            while pending and pending[0][0] < cutoff:
                time_s, block_ids = pending.popleft()
                # Still awaiting this release's judgement: neither released again since nor
                # shared again by a later release (which moved the block's time on).
                still = [b for b in block_ids if pending_at.get(b) == time_s]
                for block_id in still:
                    del pending_at[block_id]
                self.shared_releases_judged += len(still)
            return
        while pending and pending[0][0] < cutoff:
            time_s, block_hashes = pending.popleft()
            self.shared_releases_judged += len(block_hashes)
            # Every release up to `cutoff` was seen, and none later than time_s + horizon_s:
            # a later entry means the content was released again within the horizon.
            last_times = map(_time_of, memory.lookup(block_hashes, NO_ENTRY))
            self.shared_releases_reused += sum(map(lt, repeat(time_s), last_times))
        memory.forget_before(now_s - self.memory_window_s)

    def _judge_released(self, block_ids: Sequence[int], now_s: float) -> None:
        """The memory by block, at a release of `block_ids` (before their metadata changes):
        a block whose shared release awaits judgement is judged now, reused if it still
        holds that content (its metadata survived: not evicted or forgotten since) and this
        release is later (the caller judged those past the horizon already). A release at
        the same instant judges nothing, as a content's write at the same time is not a
        later one. The awaiting blocks among those released are found by one C-level set
        intersection; only they take a Python step."""
        pending_at, state = self._pending_at, self._state
        for block_id in pending_at.keys() & block_ids:
            if pending_at[block_id] < now_s:
                del pending_at[block_id]
                self.shared_releases_judged += 1
                self.shared_releases_reused += state[block_id] is not None

    def _pend(self, now_s: float, block_ids: list[int]) -> None:
        """The memory by block: these blocks were released as shared at `now_s`."""
        self._pending_at.update(zip(block_ids, repeat(now_s)))
        self._pending.append((now_s, block_ids))

    def _chain_shared(
        self, hashes: Sequence[Hashable | None], conversation_id: str | None, now_s: float
    ) -> int:
        """The memory by chain: how many of a release's top blocks it knows as shared. The
        last release under the same top hash, within the window, shares its common prefix
        with this one: all of it if that was another conversation's, else as many top blocks
        as were shared then. (`_advance` forgot the entries past the window.)"""
        entry = self._chains.get(hashes[-1]) if hashes else None
        if entry is None:
            return 0
        common = common_top(entry.hashes, hashes)
        if entry.conversation_id == conversation_id:
            return min(common, entry.shared)
        return common

    def _remember_chain(
        self,
        hashes: Sequence[Hashable | None],
        conversation_id: str | None,
        now_s: float,
        tags: Sequence[Any],
    ) -> None:
        """The memory by chain, after keying a release: kept under its top hash with its top
        stretch of shared blocks, which awaits judgement once the horizon has passed."""
        n = len(tags)
        shared = 0
        while shared < n and tags[n - 1 - shared] == SHARED:
            shared += 1
        self._chains.write(ChainEntry(conversation_id, now_s, hashes, shared))
        if shared and hashes[-1] is not None:
            self._pending.append((now_s, hashes[-1], hashes, shared))

    def _gated_probability(self, release: Release) -> float | None:
        """The release's predicted p if the model is trusted now, else None (the fallback);
        judges the releases older than the horizon first, then records this one. A NaN p is
        no prediction (LPCEvictor's rule), so it never reaches the gate's log-loss."""
        predicted = release.probability
        if predicted is not None and predicted != predicted:
            self.fallbacks_used += 1
            predicted = None
        if self.model_min_labels is None:
            return predicted
        now = release.time_s
        labels, last_release_s = self._labels, self._last_release_s
        cutoff = now - self.horizon_s
        if labels and labels[0][0] < cutoff:
            clamp = LOSS_PROBABILITY_CLAMP
            while labels and labels[0][0] < cutoff:
                time_s, conversation_id, p = labels.popleft()
                # Every release up to `cutoff` was seen and none after time_s + horizon_s.
                # (Out-of-order releases may have dropped the entry already: not continued.)
                last_s = last_release_s.get(conversation_id, time_s)
                if last_s == time_s:
                    last_release_s.pop(conversation_id, None)
                constant = (self.model_labels_continued + CONTINUED_PRIOR) / (
                    self.model_labels_judged + 1
                )
                p = clamp if p < clamp else (1.0 - clamp if p > 1.0 - clamp else p)
                if last_s > time_s:
                    self.model_labels_continued += 1
                    self.model_loss_nats -= math.log(p)
                    self.constant_loss_nats -= math.log(constant)
                else:
                    self.model_loss_nats -= math.log(1.0 - p)
                    self.constant_loss_nats -= math.log(1.0 - constant)
                self.model_labels_judged += 1
            judged = self.model_labels_judged
            self.model_trusted = (
                judged >= self.model_min_labels
                and self.model_loss_nats
                <= self.constant_loss_nats - self.model_margin_nats * judged
            )
        p = predicted
        conversation_id = release.conversation_id
        # One label per conversation and instant (a request's blocks may come in parts).
        if (
            p is not None
            and conversation_id is not None
            and last_release_s.get(conversation_id) != now
        ):
            labels.append((now, conversation_id, p))
            last_release_s[conversation_id] = now
        return p if self.model_trusted else None

    def _bound_memory(self) -> None:
        """Forget the oldest contents (by chain, releases) beyond the memory's size bound
        (after a release)."""
        if self._by_chain:
            if self._chains.held > self.memory_max_entries:
                self._chains.forget_oldest(self.memory_max_entries)
            return
        memory = self._memory
        excess = len(memory) - self.memory_max_entries
        if excess > 0:
            memory.forget_oldest(excess)

    def _probability(self, release: Release) -> float:
        """The release's p (the fallback when none was predicted or the model is not trusted),
        clamped to the floor."""
        p = self._gated_probability(release)
        if p is None:
            if release.probability is None:
                self.fallbacks_used += 1
            p = self.fallback_probability
        floor = self.probability_floor
        return floor if p < floor else (1.0 - floor if p > 1.0 - floor else p)

    def _keys(
        self, freed: FreedBlocks, release: Release, p: float
    ) -> tuple[list[float], list[str | None]]:
        """Per-block (key, tag) after this release of probability `p`; records it in the
        memory (the caller has advanced the memory to the release's time).

        A block's key and tag depend only on its memory entry and its own metadata (its run
        or ghost), and a chain's blocks share both in long stretches (the entries of the few
        releases it came from, the runs it left): one computation per stretch, C-level passes
        over the blocks. A release naming a content twice (never a chain of vLLM's hashes) is
        taken in parts that each name it once, each its own write, as a block-by-block pass
        would read and rewrite it."""
        hashes = freed.hashes
        n = len(hashes)
        nones = hashes.count(None)
        if not self._by_content or len(set(hashes)) == n - nones + (1 if nones else 0):
            return self._keys_of(freed.block_ids, hashes, release, p)
        keys: list[float] = []
        tags: list[str | None] = []
        start, seen = 0, set()
        for i, block_hash in enumerate(hashes):
            if block_hash is not None and block_hash in seen:
                part = self._keys_of(freed.block_ids[start:i], hashes[start:i], release, p)
                keys += part[0]
                tags += part[1]
                start, seen = i, set()
            seen.add(block_hash)
        part = self._keys_of(freed.block_ids[start:], hashes[start:], release, p)
        return keys + part[0], tags + part[1]

    def _keys_of(
        self,
        block_ids: Sequence[int],
        hashes: Sequence[Hashable | None],
        release: Release,
        p: float,
    ) -> tuple[list[float], list[str | None]]:
        """`_keys` of blocks whose contents are distinct (or None), as one memory write."""
        now = release.time_s
        floor = self.probability_floor
        shift = self.scale_per_s * now
        own_key = math.log(p / (1.0 - p)) + shift
        q_shared = min(max(self.shared_probability, floor), 1.0 - floor)
        shared_key = math.log(q_shared / (1.0 - q_shared)) + shift
        conversation_id = release.conversation_id
        own_tag = NO_TAG if conversation_id is None else conversation_id
        memory = self._memory
        window = self.memory_window_s
        by_content = self._by_content
        keys: list[float] = []
        tags: list[str | None] = []
        shared_hashes: list[Hashable] = []  # in block order: the memory's and the judging's
        shared_ids: list[int] = []  # the same, by block (the memory by block judges these)
        # A content without a hash has no entry; with the memory by block none has one; by
        # chain, the top blocks the memory knows as shared read as one shared entry.
        if by_content:
            lasts: Iterable[Any] = memory.lookup(hashes)
        elif self._by_chain:
            known = self._chain_shared(hashes, conversation_id, now)
            lasts = chain(repeat(None, len(block_ids) - known), repeat(_CHAIN_SHARED, known))
        else:
            lasts = repeat(None, len(block_ids))
        olds = map(self._state.__getitem__, block_ids)
        i = 0
        for (last, old), stretch in groupby(zip(lasts, olds, strict=True)):
            k = len(list(stretch))
            shared = (
                last is not None
                and now - last[1] <= window
                and (last[2] or last[0] != conversation_id)
            )
            if old is None or old.tag == own_tag:
                key = own_key
            else:
                # Either conversation comes back: OR of the old decayed p and the new one.
                x = old.key - shift  # logit of the old decayed p
                old_stays = 1.0 / (1.0 + math.exp(x)) if x < 700.0 else 0.0
                q = 1.0 - old_stays * (1.0 - p)
                q = floor if q < floor else (1.0 - floor if q > 1.0 - floor else q)
                key = math.log(q / (1.0 - q)) + shift
                shared = True
            if shared:
                if key < shared_key:
                    key = shared_key
                tags += repeat(SHARED, k)
                if by_content:
                    shared_hashes += hashes[i : i + k]
                else:
                    shared_ids += block_ids[i : i + k]
            else:
                tags += repeat(conversation_id, k)
            keys += repeat(key, k)
            i += k
        if self._by_chain:
            self._remember_chain(hashes, conversation_id, now, tags)
        elif not by_content:
            if shared_ids:  # judged at their next release, or once older than the horizon
                self._pend(now, shared_ids)
        else:
            if None in shared_hashes:
                shared_hashes = [h for h in shared_hashes if h is not None]
            memory.write(hashes, conversation_id, now, False, shared_hashes)
            if shared_hashes:  # judged together once they are older than the horizon
                self._pending.append((now, shared_hashes))
        if keys:  # OR pooling and the shared floor can give keys above the release's own
            self.top_logit = max(self.top_logit, max(keys) - shift)
        return keys, tags

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        block_ids = freed.block_ids
        if not block_ids:
            return
        now = release.time_s
        memory = self._memory
        if memory or self._pending or self._chains:
            self._advance(now)
        # _probability(release), inlined (the release path of every request).
        p = self._gated_probability(release)
        if p is None:
            if release.probability is None:
                self.fallbacks_used += 1
            p = self.fallback_probability
        floor = self.probability_floor
        p = floor if p < floor else (1.0 - floor if p > 1.0 - floor else p)
        conversation_id = release.conversation_id
        own_tag = NO_TAG if conversation_id is None else conversation_id
        state = self._state
        logit = math.log(p / (1.0 - p))
        if logit > self.top_logit:
            self.top_logit = logit
        run = self._new_run(
            logit + self.scale_per_s * now,
            conversation_id,
            block_ids,
            freed.depths,
        )
        # Fast path: blocks new to the cache or released again by their only conversation,
        # whose content the memory does not know as shared, all take this release's key and
        # form a single run (the common case). First the blocks' own metadata, as in
        # LPCEvictor, then the memory (skipped when no block carries a hash). Each is a few
        # C-level passes: the distinct memory entries of a chain are those of the few
        # releases it came from, and a chain's contents go to the memory's end as a whole.
        if self._pending_at:  # the memory by block: judged before the metadata changes
            self._judge_released(block_ids, now)
        claimed = self._claim(block_ids, run, own_tag, freed.index)
        shared = not claimed
        # Blocks without a hash find no entry and are not remembered (`ContentMemory`): the
        # hash list goes to the memory as it is, unless no block carries one.
        hashes = freed.hashes
        if (
            claimed
            and self._by_content
            and (hashes[0] is not None or hashes.count(None) != len(hashes))
        ):
            window = self.memory_window_s
            for last in memory.entries(hashes):
                if (last[2] or last[0] != conversation_id) and now - last[1] <= window:
                    shared = True
                    break
            else:  # remembered contents move to the memory's end
                memory.write(hashes, conversation_id, now, False)
                if len(memory) > self.memory_max_entries:
                    self._bound_memory()
        elif claimed and self._by_chain and hashes:
            if self._chain_shared(hashes, conversation_id, now):
                shared = True
            else:
                self._chains.write(ChainEntry(conversation_id, now, hashes, 0))
                self._bound_memory()
        if not shared:
            self._enqueue(run)
            if freed.chain:
                self._link_runs([run], freed.parent_id)
            return
        # Some block is shared: key block by block (the claim, if any, is undone).
        if claimed:
            consume(map(setitem, repeat(state), block_ids, repeat(None)), 0)
        keys, tags = self._keys(freed, release, p)
        self._bound_memory()
        runs = self._push_grouped(block_ids, freed.depths, keys, tags)
        if freed.chain:
            self._link_runs(runs, freed.parent_id)

    def push_cached_each(self, freed: FreedBlocks, release: Release) -> None:
        """`push_cached` of each block alone, in the given order, all with the same release,
        in one call (`LPCEvictor.push_cached_each`). Beyond a block's own metadata, a single
        push reads and writes the memory entry of its own content only, and judges and
        labels by the release's time, which the first push does for all: so one pass over
        the blocks in the given order (the memory's order included) is the single pushes,
        unless the memory's size bound could forget a content between two of them; then
        they are made one by one."""
        block_ids = freed.block_ids
        n = len(block_ids)
        if n <= 1:
            self.push_cached(freed, release)
            return
        if self._memory or self._pending or self._chains:
            self._advance(release.time_s)
        # By chain, a single push is a release of its own block alone (its own top): one by
        # one, as by content when the size bound could forget a content between two pushes.
        if self._by_chain or (self._by_content and len(self._memory) + n > self.memory_max_entries):
            for i in range(n):
                single = FreedBlocks([block_ids[i]], [freed.depths[i]], [freed.hashes[i]])
                self.push_cached(single, release)
            return
        before = self.fallbacks_used
        p = self._probability(release)
        self.fallbacks_used += (self.fallbacks_used - before) * (n - 1)
        logit = math.log(p / (1.0 - p))
        if logit > self.top_logit:
            self.top_logit = logit
        if self._pending_at:
            self._judge_released(block_ids, release.time_s)
        keys, tags = self._keys(freed, release, p)
        self._push_deepest_first(freed, keys, tags)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        self._advance(release.time_s)
        if self._pending_at:
            self._judge_released(freed.block_ids, release.time_s)
        keys, tags = self._keys(freed, release, self._probability(release))
        self._bound_memory()
        self._remember_grouped(freed.block_ids, keys, tags)

    def late_key(self, release: Release) -> float | None:
        """`LPCEvictor.late_key` when the trust gate trusts the model now; else None (the
        fallback p stays). The gate scores only predictions that came in time: a late one is
        not recorded as a label."""
        if not self.model_trusted:
            return None
        return super().late_key(release)

    def memory_size(self) -> int:
        """Contents the memory holds now (released within the window; by chain, the hashes
        its entries keep; none with the memory by block, which holds nothing beyond the
        blocks' own metadata)."""
        return self._chains.held if self._by_chain else len(self._memory)
