"""The two-tier replay's CPU tier: vLLM 0.33's `CPUOffloadingManager` (the manager's part: the
chunk pool and its reference counts, the store threshold's tracker, each request's accesses),
making the manager's calls into a `CachePolicy`-shaped object, in its order, with its arguments.

One simulation serves every CPU policy; only the policy differs: `lpc` and `lpc-pooled` in the
vLLM classes LPC ships (`lpc.integrations.cpu_tier_policy`), `vllm-arc` in vLLM's own ARC
(`vllm_arc_policy`), every other evictor in `host_tier.HostTierPolicy`.

Why, and what vLLM 0.33 does, read from its source: docs/design.md, "Two tiers" and "What
vLLM 0.33's CPU tier does".
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eviction import Evictor, Release
from eviction.base import ReturnCurveLike
from lpc.blocks.hashing import BlockHash
from lpc.integrations.cpu_tier_policy import EvictorCachePolicy
from lpc.integrations.finished_releases import FinishedReleases
from lpc.integrations.request_hints import CONVERSATION_KEY
from lpc.integrations.stats import PluginStats
from lpc.replay.host_tier import HostTierPolicy
from lpc.replay.vllm_arc_policy import ReplayARCCachePolicy

DEFAULT_MAX_TRACKER_SIZE = 64_000  # vLLM's CPUOffloadingManager default

# The CPU-tier policies that are vLLM's own classes, transcribed (built from the capacity alone,
# as the manager builds them), one per name of `eviction.registry.CPU_TIER_ONLY`.
VLLM_POLICIES: dict[str, type[ReplayARCCachePolicy]] = {"vllm-arc": ReplayARCCachePolicy}

# What the tier runs: LPC's vLLM classes, vLLM's own, or an evictor under the replay's rules.
TierPolicy = EvictorCachePolicy | ReplayARCCachePolicy | HostTierPolicy


@dataclass(slots=True)
class HostCounters:
    """Running totals of the CPU tier."""

    offered_chunks: int = 0
    stored_chunks: int = 0
    evictions: int = 0
    skipped_below_threshold: int = 0
    failed_stores: int = 0
    loaded_chunks: int = 0


class OfferCounts:
    """vLLM's store-threshold tracker (`CPUOffloadingManager._record_accesses`): offers per
    key, oldest first, at most `max_tracker_size` keys."""

    def __init__(self, max_tracker_size: int) -> None:
        self.max_tracker_size = max_tracker_size
        self._offers: OrderedDict[BlockHash, int] = OrderedDict()

    def get(self, key: BlockHash) -> int:
        """How many times `key` was offered (0 once the tracker forgot it)."""
        return self._offers.get(key, 0)

    def count(self, hashes: Sequence[BlockHash]) -> None:
        """Count each offered key; a full tracker forgets its oldest key that is not part of
        this offer."""
        offers = self._offers
        protected: set[BlockHash] = set()
        for h in hashes:
            if h in offers:
                offers.move_to_end(h)
                offers[h] += 1
                protected.add(h)
        unprotected = len(offers) - len(protected)
        for h in hashes:
            if h in offers:
                continue
            if len(offers) >= self.max_tracker_size:
                if unprotected == 0:
                    continue
                offers.popitem(last=False)
                unprotected -= 1
            offers[h] = 1


def check_tier_settings(num_chunks: int, store_threshold: int, max_tracker_size: int) -> None:
    """A CPU tier's settings: a ValueError that names the first bad one."""
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"num_chunks must be an int >= 1, got {num_chunks!r}")
    if isinstance(store_threshold, bool) or not isinstance(store_threshold, int):
        raise ValueError(f"store_threshold must be an int, got {store_threshold!r}")
    if store_threshold < 0:
        raise ValueError(f"store_threshold must be >= 0, got {store_threshold}")
    if max_tracker_size < 1:
        raise ValueError(f"max_tracker_size must be >= 1, got {max_tracker_size}")


class EventClock:
    """The policy's clock: the time of the event being replayed."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@dataclass(slots=True)
class ChunkStatus:
    """vLLM's `ChunkStatus` as the policy reads it: -1 while the store is in flight, then the
    number of loads reading the chunk."""

    ref_cnt: int = -1


@dataclass(slots=True)
class RequestContext:
    """The parts of vLLM's `ReqContext` the policy reads (its id, `kv_transfer_params`,
    `kv_hints`, each key's end-token position), and the manager's record of the request's
    accesses (`_RequestCacheAccess`): the keys it saw, first sight first, those it inserted
    and those it reused, and its store misses."""

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    kv_hints: Any = None
    positions: dict[BlockHash, int] = field(default_factory=dict)
    seen: dict[BlockHash, None] = field(default_factory=dict)
    inserted: set[BlockHash] = field(default_factory=set)
    reused: set[BlockHash] = field(default_factory=set)
    store_misses: set[BlockHash] = field(default_factory=set)

    def get_offload_key_position(self, key: BlockHash) -> int | None:
        return self.positions.get(key)


class ReplayStats(PluginStats):
    """The policy's counters in a replay: an exception the engine would absorb (counted, and
    that call done as LRU would) stops the replay instead, so that no figure rests on it."""

    def plugin_error(self, where: str, error: BaseException) -> None:
        raise RuntimeError(f"the CPU tier's policy failed in {where}: {error!r}") from error


class CachePolicyTier:
    """A pool of `num_chunks` CPU chunks ordered by `policy` (an `EvictorCachePolicy` or a
    `HostTierPolicy` built on `clock` and `finished`, which this tier sets and fills, or one of
    vLLM's own policies, `VLLM_POLICIES`, which read neither); `block_size` tokens per chunk
    give the keys' positions."""

    def __init__(
        self,
        num_chunks: int,
        policy: TierPolicy,
        clock: EventClock,
        finished: FinishedReleases,
        block_size: int,
        store_threshold: int = 0,
        max_tracker_size: int = DEFAULT_MAX_TRACKER_SIZE,
    ) -> None:
        check_tier_settings(num_chunks, store_threshold, max_tracker_size)
        if policy.cache_capacity != num_chunks:
            raise ValueError(
                f"the policy holds {policy.cache_capacity} chunks, the tier {num_chunks}"
            )
        self.num_chunks = num_chunks
        self.policy = policy
        # Whether the tier's state depends on the chunks a request loads (the GPU hit decides
        # where its CPU lookup starts): a policy that holds or re-releases what a request
        # reads does; `HostTierPolicy` does not, and then one tier serves several GPU replays
        # at once (`two_tier_grid.replay_host_tier_for`).
        self.reads_loads: bool = policy_reads_loads(type(policy))
        self.clock = clock
        self.finished = finished
        self.block_size = block_size
        self.store_threshold = store_threshold
        self.counters = HostCounters()
        self._offers = OfferCounts(max_tracker_size) if store_threshold >= 2 else None
        self._resident = 0  # chunks the policy holds (every one evictable between events)
        self._requests: dict[str, RequestContext] = {}

    @classmethod
    def running(
        cls,
        policy_class: type[EvictorCachePolicy],
        num_chunks: int,
        evictor: str,
        evictor_options: Mapping[str, Any],
        block_size: int,
        store_threshold: int = 0,
    ) -> CachePolicyTier:
        """A tier running `policy_class` over `evictor` (built with `evictor_options`), on this
        tier's clock and finished releases, stopping at any fault (`ReplayStats`)."""
        clock, finished = EventClock(), FinishedReleases()
        policy = policy_class(
            num_chunks,
            evictor,
            clock=clock,
            stats=ReplayStats(),
            finished=finished,
            **evictor_options,
        )
        return cls(num_chunks, policy, clock, finished, block_size, store_threshold)

    @classmethod
    def over_evictor(
        cls,
        num_chunks: int,
        evictor: Evictor,
        block_size: int,
        store_threshold: int = 0,
        max_tracker_size: int = DEFAULT_MAX_TRACKER_SIZE,
    ) -> CachePolicyTier:
        """A tier whose chunks `evictor` orders under the replay's release rules
        (`HostTierPolicy`; the evictor built for `num_chunks + 1` blocks), on this tier's clock
        and finished releases."""
        check_tier_settings(num_chunks, store_threshold, max_tracker_size)
        clock, finished = EventClock(), FinishedReleases()
        policy = HostTierPolicy(num_chunks, evictor, block_size, clock, finished)
        return cls(
            num_chunks, policy, clock, finished, block_size, store_threshold, max_tracker_size
        )

    @classmethod
    def running_vllm(
        cls, name: str, num_chunks: int, block_size: int, store_threshold: int = 0
    ) -> CachePolicyTier:
        """A tier running vLLM's own policy `name` (`VLLM_POLICIES`), built from its capacity
        alone as `CPUOffloadingManager` builds it (`policy_cls(cache_capacity=num_chunks)`)."""
        policy = VLLM_POLICIES[name](cache_capacity=num_chunks)
        clock, finished = EventClock(), FinishedReleases()
        return cls(num_chunks, policy, clock, finished, block_size, store_threshold)

    def __contains__(self, block_hash: object) -> bool:
        return self.policy.get(block_hash) is not None

    def __iter__(self) -> Iterator[BlockHash]:
        """The resident chunks' keys."""
        return iter(self.policy)

    def __len__(self) -> int:
        """Resident chunks."""
        return self._resident

    def lookup(self, hashes: Sequence[BlockHash], start: int, end: int) -> int:
        """How many consecutive chunks from `hashes[start]` on (before `end`) are resident
        (`get`, which changes nothing)."""
        n = 0
        get = self.policy.get
        for h in hashes[start:end]:
            if get(h) is None:
                break
            n += 1
        return n

    def load(
        self,
        request_id: str,
        hashes: Sequence[BlockHash],
        start: int,
        count: int,
        now_s: float,
        conversation_id: str | None = None,
    ) -> None:
        """`prepare_load` + `complete_load` at `now_s` of `count` chunks from `hashes[start]`
        on: each is pinned (`mark_non_evictable` when nothing else read it), the request's
        access is recorded (`on_request_access`, where the policy holds them for the request),
        and each is unpinned (`mark_evictable`)."""
        if count == 0:
            return
        self.clock.now_s = now_s
        context = self._context(request_id, conversation_id)
        keys = list(hashes[start : start + count])
        policy = self.policy
        get = policy.get
        chunks = []
        for depth, key in enumerate(keys, start):
            chunk = get(key)
            if chunk is None:
                raise KeyError(f"request {request_id}: chunk at depth {depth} is not resident")
            context.positions[key] = (depth + 1) * self.block_size
            if chunk.ref_cnt == 0:
                policy.mark_non_evictable(key)
            chunk.ref_cnt += 1
            chunks.append(chunk)
        self._record_access(context, keys, keys)
        for key, chunk in zip(keys, chunks, strict=True):
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                policy.mark_evictable(key)
        self.counters.loaded_chunks += count

    def offer(
        self,
        request_id: str,
        hashes: Sequence[BlockHash],
        now_s: float,
        conversation_id: str | None = None,
    ) -> int:
        """`prepare_store` + `complete_store` of a request's prompt chunks, in prefix order;
        the request's context carries its conversation (`kv_transfer_params`), as a client
        that names it sends. Returns how many chunks were stored."""
        self.clock.now_s = now_s
        counters = self.counters
        counters.offered_chunks += len(hashes)
        context = self._context(request_id, conversation_id)
        block_size = self.block_size
        ends = range(block_size, (len(hashes) + 1) * block_size, block_size)
        context.positions.update(zip(hashes, ends, strict=True))
        policy = self.policy
        get = policy.get
        keys = list(hashes)
        if self._offers is not None:
            self._offers.count(keys)
        to_store: list[BlockHash] = []
        resident: list[BlockHash] = []
        for key in keys:
            if get(key) is None:
                to_store.append(key)
            else:
                resident.append(key)  # every resident chunk is ready between events
        if self._offers is not None:
            offers, threshold = self._offers, self.store_threshold
            kept = [key for key in to_store if offers.get(key) >= threshold]
            counters.skipped_below_threshold += len(to_store) - len(kept)
            to_store = kept
        misses = [key for key in to_store if key not in context.store_misses]
        if misses:
            policy.on_store_miss(misses, context)
            context.store_misses.update(misses)
        if len(to_store) + len(resident) < len(keys):  # the threshold kept some out
            recorded = {*to_store, *resident}
            keys_recorded = [key for key in keys if key in recorded]
        else:
            keys_recorded = keys
        self._record_access(context, keys_recorded, resident)
        if not to_store:
            return 0
        to_evict = len(to_store) - (self.num_chunks - self._resident)
        if to_evict > 0:
            evicted = None
            if to_evict <= self._resident:
                evicted = policy.evict(to_evict, set(keys))
            if evicted is None:
                counters.failed_stores += 1
                return 0
            self._resident -= len(evicted)
            counters.evictions += len(evicted)
        for key in to_store:
            policy.insert(key, ChunkStatus(), context)
        context.inserted.update(to_store)
        for key in to_store:
            chunk = get(key)
            if chunk is not None and chunk.ref_cnt < 0:
                chunk.ref_cnt = 0
                policy.mark_evictable(key)
        self._resident += len(to_store)
        counters.stored_chunks += len(to_store)
        return len(to_store)

    def finish(
        self,
        request_id: str,
        now_s: float,
        probability: float | None,
        conversation_id: str,
        category: str | None = None,
        return_curve: ReturnCurveLike | None = None,
    ) -> None:
        """The GPU plugin's release of the request (its p, conversation and return curve,
        recorded by request id as `KVCacheManager.free` does), then `on_request_finished`
        with every key the request saw, head to tail."""
        context = self._requests.pop(request_id, None)
        if context is None:
            return
        self.clock.now_s = now_s
        self.finished.record(
            request_id,
            Release(now_s, probability, conversation_id, category, return_curve),
        )
        positions = context.positions
        keys = tuple(sorted(context.seen, key=positions.__getitem__))
        self.policy.on_request_finished(
            (keys,) if keys else (),
            context.inserted - context.reused,
            set(context.reused),
            context,
        )

    def check_invariants(self) -> None:
        """The policy's own invariants, and it holds the tier's chunks with no reader left
        (nothing is pinned between events). Reads only: pushing the pending chunks here would
        change when the policy pushes them."""
        policy = self.policy
        policy.check_invariants()
        assert len(policy) == self._resident, (
            f"the policy holds {len(policy)} chunks, the tier counts {self._resident}"
        )

    # -- internals ----------------------------------------------------------------------
    def _context(self, request_id: str, conversation_id: str | None) -> RequestContext:
        """The request's context, made at its first load or offer (`on_new_request`), with its
        conversation in `kv_transfer_params`, as a client that names it sends it."""
        context = self._requests.get(request_id)
        if context is None:
            params = {CONVERSATION_KEY: conversation_id} if conversation_id else None
            context = self._requests[request_id] = RequestContext(request_id, params)
        return context

    def _record_access(
        self, context: RequestContext, keys: Sequence[BlockHash], reused: Sequence[BlockHash]
    ) -> None:
        """vLLM's `_record_request_cache_access`: the keys the request sees for the first
        time go to `on_request_access`; `reused` counts unless the request inserted it."""
        seen = context.seen
        new = [key for key in keys if key not in seen]
        for key in new:
            seen[key] = None
        if new:
            self.policy.on_request_access(new, context)
        inserted = context.inserted
        context.reused.update(key for key in reused if key not in inserted)


def policy_reads_loads(policy_class: type) -> bool:
    """Whether a tier running `policy_class` reads its loads (`CachePolicyTier.reads_loads`):
    unless the class says it does not, as `HostTierPolicy` does."""
    return bool(getattr(policy_class, "reads_loads", True))
