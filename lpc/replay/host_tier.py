"""The CPU (host) tier below the GPU prefix cache, with vLLM 0.33's `OffloadingConnector`
semantics and any evictor of `eviction/` in place of vLLM's `CachePolicy`.

What vLLM 0.33 does (read from its source; paths under `vllm/`):
- Granularity. The CPU tier stores chunks of `blocks_per_chunk` GPU blocks
  (`distributed/kv_transfer/kv_connector/v1/offloading/config.py`: `block_size` in
  `kv_connector_extra_config` must be a multiple of the GPU block size; default 1 block per
  chunk). A chunk's key is the hash of its last GPU block, so a chunk is one point of the
  prefix chain. This tier models the default: one chunk per GPU block.
- Size. `--kv-offloading-size` GiB becomes `cpu_bytes_to_use`; the number of chunks is that
  divided by the KV bytes of a chunk (`v1/kv_offload/cpu/spec.py`, `CPUOffloadingSpec`).
  Here the size is given in tokens; `lpc.replay.latency` converts it to bytes.
- What is stored and when. Stores are write-through, not write-back on GPU eviction: at every
  scheduler step `OffloadingConnectorScheduler._build_store_jobs`
  (`.../offloading/scheduler.py`) offers the chunks a request has newly computed, up to
  `offload_prompt_only` (default True, `v1/kv_offload/base.py`) the prompt's full chunks.
  At the lookup (`get_num_new_matched_tokens`) `next_stored_chunk_idx` restarts at 0, so
  every full chunk of the prompt is offered, those the GPU prefix cache served included.
  Here a request's prompt is offered once, right after its lookup (its prefill computes it).
- Store threshold. `CPUOffloadingManager.prepare_store` (`v1/kv_offload/cpu/manager.py`)
  stores an offered chunk only when the chunk has been offered at least `store_threshold`
  times (default 0, i.e. always; at >= 2 an LRU-ordered tracker of at most
  `max_tracker_size` = 64,000 keys counts offers). Chunks already resident are not stored
  again; they count as reused.
- Eviction. When the free chunks do not suffice, `prepare_store` asks the policy to
  `evict(n, protected)` with every key of the offer protected; if it cannot, the whole store
  is dropped (`None`, "cannot store chunks"). An evicted chunk is simply gone: nothing moves
  further down, and the GPU tier is not told.
- Lookup. The scheduler first takes the GPU prefix cache's hit (`num_computed_tokens`), then
  `_lookup_complete_chunks` / `_maximal_prefix_lookup` look the CPU keys up from the first
  chunk after the GPU hit and stop at the first miss: the CPU tier only continues the GPU
  prefix. The hit is loaded into freshly allocated GPU blocks before the request runs
  (`prepare_load` pins the chunks with a reference count; `complete_load` unpins them).
- Recency. `lookup` does not touch. A policy sees a request's accesses through
  `on_request_access` (store-time, provisional) and `on_request_finished(key_groups,
  insertion_only_keys, reused_keys, req_context)` when the request finishes; vLLM's LRU gives
  the head of the prompt the newest rank, so a prompt's tail is evicted before its head.

How the evictor stands in for the `CachePolicy`: every CPU slot lives in the evictor (loads
and stores are instantaneous here, so no chunk is ever pinned across events). Storing pops
slots (a popped slot that held a chunk is an eviction); the offer's resident chunks are taken
out of the evictor first, which is vLLM's `protected`. The offer's chunks then go back
tail first (the order the GPU block manager frees a sequence in) with the request's
conversation and no prediction yet, and again when the request finishes, with its predicted
continuation probability: `on_request_finished` is where vLLM hands a policy the request.

These release rules are vLLM's `lru`'s (its `on_request_access` ranks a request's chunks when
it first sees them, its `on_request_finished` again) and `LPCReturnCachePolicy`'s (made to
follow them; both checked against vLLM, tests/vllm/test_two_tier_agreement.py). They are not
those of `LPCCachePolicy` and `LPCPooledCachePolicy`, which keep a running request's stores
provisional until it finishes: the replay runs `lpc` and `lpc-pooled` inside those classes
instead (`cache_policy_tier.CachePolicyTier`, the same interface, `CpuTier`). The other
evictors have no vLLM class; they run under these rules.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from eviction import Evictor, FreedBlocks, Release
from eviction.base import ReturnCurveLike
from lpc.blocks.hashing import BlockHash

DEFAULT_MAX_TRACKER_SIZE = 64_000  # vLLM's CPUOffloadingManager default


@dataclass(slots=True)
class HostCounters:
    """Running totals of the CPU tier."""

    offered_chunks: int = 0
    stored_chunks: int = 0
    evictions: int = 0
    skipped_below_threshold: int = 0
    failed_stores: int = 0
    loaded_chunks: int = 0


class CpuTier(Protocol):
    """What the two-tier replay asks of a CPU tier: `HostTier`, or
    `cache_policy_tier.CachePolicyTier` for the policies whose vLLM class it runs itself."""

    num_chunks: int
    counters: HostCounters
    # Whether the tier's state depends on the chunks a request loads (the GPU hit decides
    # where its CPU lookup starts); when not, one tier serves several GPU replays at once
    # (`two_tier_grid.replay_host_tier_for`).
    reads_loads: bool

    def __contains__(self, block_hash: object) -> bool: ...

    def __iter__(self) -> Iterator[BlockHash]: ...

    def __len__(self) -> int: ...

    def lookup(self, hashes: Sequence[BlockHash], start: int, end: int) -> int: ...

    def load(
        self,
        request_id: str,
        hashes: Sequence[BlockHash],
        start: int,
        count: int,
        now_s: float,
        conversation_id: str | None = None,
    ) -> None: ...

    def offer(
        self,
        request_id: str,
        hashes: Sequence[BlockHash],
        now_s: float,
        conversation_id: str | None = None,
    ) -> int: ...

    def finish(
        self,
        request_id: str,
        now_s: float,
        probability: float | None,
        conversation_id: str,
        category: str | None = None,
        return_curve: ReturnCurveLike | None = None,
    ) -> None: ...

    def check_invariants(self) -> None: ...


@dataclass(slots=True)
class _Access:
    """The chunks one request stored or reused, by depth in its prompt, for its finish."""

    by_depth: dict[int, BlockHash] = field(default_factory=dict)


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
    """A CPU tier's settings, as `HostTier` and `CachePolicyTier` take them: a ValueError that
    names the first bad one."""
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"num_chunks must be an int >= 1, got {num_chunks!r}")
    if isinstance(store_threshold, bool) or not isinstance(store_threshold, int):
        raise ValueError(f"store_threshold must be an int, got {store_threshold!r}")
    if store_threshold < 0:
        raise ValueError(f"store_threshold must be >= 0, got {store_threshold}")
    if max_tracker_size < 1:
        raise ValueError(f"max_tracker_size must be >= 1, got {max_tracker_size}")


class HostTier:
    """A pool of `num_chunks` CPU chunks, one GPU block each, ordered by `evictor`.

    The evictor must be built for `num_chunks + 1` blocks: slot ids are 1..num_chunks, as
    the GPU block manager's are (its block 0 is the null block)."""

    # A load only records chunks that the request's offer, which always follows it, records
    # and releases again (every resident chunk of the prompt, with the rest): what the tier
    # holds and in what order never depends on which chunks a request loaded, only on which
    # requests reached it.
    reads_loads = False

    def __init__(
        self,
        num_chunks: int,
        evictor: Evictor,
        store_threshold: int = 0,
        max_tracker_size: int = DEFAULT_MAX_TRACKER_SIZE,
    ) -> None:
        check_tier_settings(num_chunks, store_threshold, max_tracker_size)
        self.num_chunks = num_chunks
        self.evictor = evictor
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.counters = HostCounters()
        self._slot_of: dict[BlockHash, int] = {}
        self._hash_of: list[BlockHash | None] = [None] * (num_chunks + 1)
        # Offers per key; only with a threshold of 2 or more, as in vLLM.
        self._offers = OfferCounts(max_tracker_size) if store_threshold >= 2 else None
        self._accesses: dict[str, _Access] = {}
        evictor.reset(range(1, num_chunks + 1))

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._slot_of

    def __iter__(self) -> Iterator[BlockHash]:
        """The resident chunks' keys."""
        return iter(self._slot_of)

    def __len__(self) -> int:
        """Resident chunks."""
        return len(self._slot_of)

    def lookup(self, hashes: Sequence[BlockHash], start: int, end: int) -> int:
        """How many consecutive chunks from `hashes[start]` on (before `end`) are resident:
        the CPU hit that continues a GPU hit of `start` blocks. Touches nothing."""
        n = 0
        slot_of = self._slot_of
        for h in hashes[start:end]:
            if h not in slot_of:
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
        """Load `count` chunks from `hashes[start]` on into the GPU at `now_s`: they count as
        reused by the request (vLLM's `prepare_load` records them). Nothing is released at a
        load under these rules (the offer that follows releases them), so neither the time nor
        the request's conversation is read here."""
        access = self._accesses.setdefault(request_id, _Access())
        for depth in range(start, start + count):
            if hashes[depth] not in self._slot_of:
                raise KeyError(f"request {request_id}: chunk at depth {depth} is not resident")
            access.by_depth[depth] = hashes[depth]
        self.counters.loaded_chunks += count

    def offer(
        self,
        request_id: str,
        hashes: Sequence[BlockHash],
        now_s: float,
        conversation_id: str | None = None,
    ) -> int:
        """vLLM's `prepare_store` + `complete_store` for a request's prompt chunks, in prefix
        order. Returns how many chunks were stored."""
        counters = self.counters
        counters.offered_chunks += len(hashes)
        if self._offers is not None:
            self._offers.count(hashes)
        slot_of = self._slot_of
        resident: list[int] = []
        seen: set[BlockHash] = set()
        candidates = []
        for d, h in enumerate(hashes):
            if h in slot_of:
                resident.append(d)
            elif h not in seen:
                seen.add(h)
                candidates.append(d)
        if self._offers is not None:
            offers, threshold = self._offers, self.store_threshold
            kept = [d for d in candidates if offers.get(hashes[d]) >= threshold]
            counters.skipped_below_threshold += len(candidates) - len(kept)
            candidates = kept
        by_depth = self._accesses.setdefault(request_id, _Access()).by_depth
        for d in resident:
            by_depth[d] = hashes[d]
        for d in candidates:
            by_depth[d] = hashes[d]
        evictor = self.evictor
        # vLLM protects every key of the offer from this store's evictions.
        remove = evictor.remove
        for d in resident:
            remove(slot_of[hashes[d]])
        stored: list[int] = []
        if candidates and len(candidates) <= len(evictor):
            slots = evictor.pop_n(len(candidates), now_s)
            for slot in slots:
                old = self._hash_of[slot]
                if old is not None:
                    del slot_of[old]
                    counters.evictions += 1
            for d, slot in zip(candidates, slots, strict=True):
                slot_of[hashes[d]] = slot
                self._hash_of[slot] = hashes[d]
            stored = candidates
            counters.stored_chunks += len(stored)
        elif candidates:
            counters.failed_stores += 1
        depths = sorted([*resident, *stored], reverse=True)
        self._release(hashes, depths, Release(now_s, None, conversation_id or request_id))
        return len(stored)

    def finish(
        self,
        request_id: str,
        now_s: float,
        probability: float | None,
        conversation_id: str,
        category: str | None = None,
        return_curve: ReturnCurveLike | None = None,
    ) -> None:
        """vLLM's `on_request_finished`: the request's stored and reused chunks that are still
        resident go back to the evictor, tail first, with the request's probability (and its
        workload category, for the policies that keep one queue per category, and its return
        curve, for those that ask when the conversation comes back)."""
        access = self._accesses.pop(request_id, None)
        if access is None:
            return
        slot_of = self._slot_of
        by_depth = access.by_depth
        live = sorted([d for d, h in by_depth.items() if h in slot_of], reverse=True)
        if not live:
            return
        live_hashes = [by_depth[d] for d in live]
        slots = [slot_of[h] for h in live_hashes]
        remove = self.evictor.remove
        for slot in slots:
            remove(slot)
        freed = FreedBlocks(list(slots), live, live_hashes)
        self.evictor.push_cached(
            freed,
            Release(
                now_s, probability, conversation_id, category=category, return_curve=return_curve
            ),
        )

    def check_invariants(self) -> None:
        """Every slot is in the evictor (nothing is pinned between events) and the two maps
        agree."""
        self.evictor.check_invariants()
        assert len(self.evictor) == self.num_chunks, "a CPU slot is missing from the evictor"
        for h, slot in self._slot_of.items():
            assert self._hash_of[slot] == h, f"slot {slot} disagrees with its key"
        assert sum(h is not None for h in self._hash_of) == len(self._slot_of)

    # -- internals ----------------------------------------------------------------------
    def _release(self, hashes: Sequence[BlockHash], depths: list[int], release: Release) -> None:
        if not depths:
            return
        slot_of = self._slot_of
        freed = FreedBlocks(
            [slot_of[hashes[d]] for d in depths], depths, [hashes[d] for d in depths]
        )
        self.evictor.push_cached(freed, release)
