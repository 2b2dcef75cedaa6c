"""The replay's own release rules for the CPU tier, as a vLLM `CachePolicy` over any evictor of
`eviction/` (`HostTierPolicy`): what the one CPU-tier simulation
(`cache_policy_tier.CachePolicyTier`, vLLM 0.33's `CPUOffloadingManager`) runs for every CPU
policy that has no vLLM class of its own.

A request's store releases its chunks with no prediction yet, and its finish releases them
again with its predicted p: vLLM's `lru`'s rules and `LPCReturnCachePolicy`'s.

The rules, how the evictor holds the tier, and pins: docs/design.md, "Two tiers" and "The
replay's release rules".
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from eviction import Evictor, FreedBlocks, Release
from lpc.integrations.finished_releases import FinishedReleases
from lpc.integrations.request_hints import CONVERSATION_KEY


@dataclass(slots=True)
class _Chunk:
    """A resident chunk: vLLM's status object, its evictor slot (0 until its store pops one),
    its depth in the prompt, the release it is in the evictor with (or goes back with), and
    where it stands: its store complete (`ready`), pinned by a load, held by the open store,
    in the evictor (`queued`: every ready chunk but those the open store took out or inserted)."""

    status: Any
    slot: int
    depth: int
    release: Release | None = None
    queued: bool = False
    ready: bool = False
    pinned: bool = False
    held: bool = False


@dataclass(slots=True)
class _Store:
    """The open store of one request: its context, conversation and time, the resident chunks
    it holds (first access first), the chunks it inserted, and whether the held ones left the
    evictor already (at its eviction)."""

    context: Any
    conversation_id: str
    time_s: float
    held: list[Any] = field(default_factory=list)
    inserted: list[Any] = field(default_factory=list)
    taken_out: bool = False


class HostTierPolicy:
    """vLLM's `CachePolicy` hooks over `evictor` under the replay's release rules (see the
    module). `evictor` must be built for `cache_capacity + 1` blocks; `block_size` tokens per
    chunk turn a key's end-token position (`get_offload_key_position`) into its depth; `clock`
    and `finished` are the tier's (the event's time, the GPU plugin's releases)."""

    # A load changes nothing in the evictor (the module): one pass of this policy serves GPU
    # replays with different hits (`two_tier_grid.replay_host_tier_for`).
    reads_loads = False

    def __init__(
        self,
        cache_capacity: int,
        evictor: Evictor,
        block_size: int,
        clock: Callable[[], float] = time.monotonic,
        finished: FinishedReleases | None = None,
    ) -> None:
        if cache_capacity < 1:
            raise ValueError(f"cache_capacity must be >= 1, got {cache_capacity}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.cache_capacity = cache_capacity
        self.evictor = evictor
        self.block_size = block_size
        self.finished = finished
        self._clock = clock
        self._chunks: dict[Any, _Chunk] = {}
        self._status: dict[Any, Any] = {}
        self._key_of: list[Any] = []
        self._reserve: list[int] = []  # slots popped for the open store's inserts, last first
        self._store: _Store | None = None
        self._num_queued = 0  # chunks in the evictor
        self._num_slotless = 0  # the open store's inserts that wait for a slot
        self._pinned: set[Any] = set()  # chunks a load reads (they stay in the evictor)
        self.get = self._status.get  # type: ignore[method-assign]
        self.clear()

    # -- CachePolicy ------------------------------------------------------------------------
    def get(self, key: Any) -> Any:
        return self._status.get(key)

    def insert(self, key: Any, chunk: Any, req_context: Any) -> None:
        chunks = self._chunks
        if key in chunks:
            raise KeyError(f"insert of a resident chunk: {key!r}")
        if len(chunks) >= self.cache_capacity:
            raise RuntimeError(f"insert beyond the capacity of {self.cache_capacity} chunks")
        store = self._store
        if store is None or store.context is not req_context:
            store = self._open(req_context)
        else:
            store.time_s = self._clock()
        reserve = self._reserve
        slot = reserve.pop() if reserve else 0
        position = req_context.get_offload_key_position(key)
        depth = 0 if position is None else position // self.block_size - 1
        # (status, slot, depth, release, queued, ready, pinned, held), positional: the hot path
        chunks[key] = _Chunk(chunk, slot, depth, None, False, chunk.ref_cnt == 0, False, True)
        self._status[key] = chunk
        if slot:
            self._key_of[slot] = key
        else:
            self._num_slotless += 1
        store.inserted.append(key)

    def remove(self, key: Any) -> None:
        self._flush()
        record = self._drop(key)
        if record.slot:
            if record.queued:
                self.evictor.remove(record.slot)
            self.evictor.push_uncached([record.slot])

    def touch(self, keys: Iterable[Any], req_context: Any) -> None:
        """LRU's touch: the keys take the request's release now (no prediction), tail first."""
        self._flush()
        release = Release(self._clock(), None, _conversation(req_context))
        self._rerelease(list(keys), req_context, release)

    def on_store_miss(self, keys: Iterable[Any], req_context: Any) -> None:
        """Nothing: a missed key is not resident, so there is nothing to reorder (vLLM's default
        would `touch` it)."""
        return

    def on_request_access(self, keys: Iterable[Any], req_context: Any) -> None:
        """The request's store holds the resident keys, released with it when it is over."""
        store = self._open(req_context)
        chunks = self._chunks
        position = req_context.get_offload_key_position
        block_size = self.block_size
        held = store.held
        for key in keys:
            record = chunks.get(key)
            if record is None:
                continue
            at = position(key)
            if at is not None:
                record.depth = at // block_size - 1
            if not record.held:
                record.held = True
                held.append(key)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[Any]],
        insertion_only_keys: set[Any],
        reused_keys: set[Any],
        req_context: Any,
    ) -> None:
        """Every key the request saw takes its final release, tail first: the GPU plugin's,
        recorded by request id (its p, conversation, category and curve), else no p now."""
        self._flush()
        release = None
        if self.finished is not None:
            release = self.finished.get(str(getattr(req_context, "req_id", "")))
        if release is None:
            release = Release(self._clock(), None, _conversation(req_context))
        self._rerelease([key for group in key_groups for key in group], req_context, release)

    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, Any]] | None:
        """`n` chunks out, none protected, pinned or held by the open store, or None with no
        change. The open store's held chunks leave the evictor first (prefix first), then one
        `pop_n` takes the free slots its inserts get too."""
        if n == 0:
            return []
        store = self._store
        if store is not None and store.inserted:  # a new store of the same request
            self._flush()
            store = None
        if self._reserve:  # slots an eviction popped that no insert took: free again
            self.evictor.push_uncached(self._reserve[::-1])
            self._reserve = []
        chunks = self._chunks
        shielded: dict[Any, _Chunk] = {}
        for key in protected:
            record = chunks.get(key)
            if record is None or record.held or not record.queued:
                continue
            if store is not None:  # the store releases what it protects, as its accesses
                record.held = True
                store.held.append(key)
            else:
                shielded[key] = record
        for key in self._pinned:  # read by a load, still in the evictor
            record = chunks[key]
            if record.queued and not record.held:
                shielded[key] = record
        held_out = 0
        if store is not None and not store.taken_out:
            held_out = sum(chunks[key].queued for key in store.held if key in chunks)
        if n > self._num_queued - held_out - len(shielded):
            return None
        if store is not None:
            self._take_out(store)
        shielded_records = sorted(shielded.values(), key=_DEPTH)  # a set's order is no order
        remove = self.evictor.remove
        for record in shielded_records:
            remove(record.slot)
            record.queued = False
        self._num_queued -= len(shielded_records)
        free = self.cache_capacity - (len(chunks) - self._num_slotless)
        slots = self.evictor.pop_n(n + free, self._clock())
        key_of = self._key_of
        evicted = []
        for slot in slots:
            key = key_of[slot]
            if key is not None:
                evicted.append((key, self._drop(key).status))
        self._reserve = slots[::-1]  # `insert` pops from the end: pop order
        for record in reversed(shielded_records):
            self._push([record], record.release)
        return evicted

    def clear(self) -> None:
        self._chunks.clear()
        self._status.clear()
        self._pinned.clear()
        self._key_of = [None] * (self.cache_capacity + 1)
        self._reserve = []
        self._store = None
        self._num_queued = self._num_slotless = 0
        self.evictor.reset(range(1, self.cache_capacity + 1))

    def mark_evictable(self, key: Any) -> None:
        """A load of the chunk completed (it is no longer pinned), or its store did: then it
        goes back with its store, or, when that is over already, alone with its release."""
        record = self._chunks[key]
        if record.ready:
            record.pinned = False
            self._pinned.discard(key)
            return
        record.ready = True
        if record.held or not record.slot:
            return
        self._flush()
        self._push([record], record.release)

    def mark_non_evictable(self, key: Any) -> None:
        """A load pins the chunk; it stays in the evictor, shielded from evictions (module)."""
        self._chunks[key].pinned = True
        self._pinned.add(key)

    # -- checks (not vLLM's) ------------------------------------------------------------------
    def __len__(self) -> int:
        """Resident chunks."""
        return len(self._chunks)

    def __iter__(self) -> Iterator[Any]:
        """The resident chunks' keys."""
        return iter(self._chunks)

    def check_invariants(self) -> None:
        """The records, vLLM's statuses and the slots agree, and every slot is in exactly one
        place: free in the evictor, reserved for the open store, or a chunk's (in the evictor
        or out of it). Reads only: closing the open store here would move its evictor calls."""
        chunks = self._chunks
        assert chunks.keys() == self._status.keys(), "the records and vLLM's statuses differ"
        slotted = [record for record in chunks.values() if record.slot]
        for key, record in chunks.items():
            if record.slot:
                assert self._key_of[record.slot] == key, f"slot {record.slot} disagrees"
        assert sum(k is not None for k in self._key_of) == len(slotted), "a slot lost its key"
        assert len(chunks) - len(slotted) == self._num_slotless, "slotless inserts miscounted"
        assert len(chunks) + len(self._reserve) <= self.cache_capacity, "over capacity"
        assert self._pinned == {key for key, record in chunks.items() if record.pinned}
        store = self._store
        inserted = set() if store is None else set(store.inserted)
        taken_out = store is not None and store.taken_out
        for key, record in chunks.items():  # in the evictor: every ready chunk but the store's
            out = key in inserted or (record.held and taken_out)
            assert record.queued == (record.ready and not out), f"{key!r} misplaced"
        self.evictor.check_invariants()
        queued = sum(record.queued for record in slotted)
        assert queued == self._num_queued, f"{queued} chunks queued, {self._num_queued} counted"
        free = self.cache_capacity - len(slotted) - len(self._reserve)
        assert len(self.evictor) == free + queued, (
            f"the evictor holds {len(self.evictor)} slots, {free} free + {queued} queued"
        )
        held = sum(record.held for record in chunks.values())
        assert held == (0 if store is None else len({*store.held, *store.inserted} & set(chunks)))

    # -- internals ----------------------------------------------------------------------------
    def _open(self, req_context: Any) -> _Store:
        """The request's open store (another request's is over first), at the clock's time."""
        store = self._store
        now = self._clock()
        if store is not None and store.context is not req_context:
            self._flush()
            store = None
        if store is None:
            store = self._store = _Store(req_context, _conversation(req_context), now)
        store.time_s = now
        return store

    def _flush(self) -> None:
        """Close the open store: its held chunks leave the evictor (unless its eviction took
        them out), its slotless inserts pop free slots, and all go back in one push, tail
        first, with the store's release."""
        store = self._store
        if store is None:
            return
        self._store = None
        if not store.taken_out:
            self._take_out(store)
        chunks = self._chunks
        inserted = [(key, chunks[key]) for key in store.inserted if key in chunks]
        slotless = [(key, record) for key, record in inserted if not record.slot]
        if slotless:
            slots = self.evictor.pop_n(len(slotless), store.time_s)
            key_of = self._key_of
            for (key, record), slot in zip(slotless, slots, strict=True):
                if key_of[slot] is not None:
                    raise RuntimeError(f"the evictor handed out cached slot {slot} for a free one")
                record.slot = slot
                key_of[slot] = key
            self._num_slotless -= len(slotless)
        records = [chunks[key] for key in store.held if key in chunks]
        records.extend(record for _, record in inserted)
        release = Release(store.time_s, None, store.conversation_id)
        for record in records:
            record.held = False
            record.release = release
        records.sort(key=_DEPTH, reverse=True)
        self._push(records, release)

    def _take_out(self, store: _Store) -> None:
        """The store's held chunks leave the evictor, prefix first."""
        store.taken_out = True
        chunks = self._chunks
        held = [chunks[key] for key in store.held if key in chunks]
        held.sort(key=_DEPTH)
        remove = self.evictor.remove
        for record in held:
            if record.queued:
                remove(record.slot)
                record.queued = False
                self._num_queued -= 1

    def _rerelease(self, keys: list[Any], req_context: Any, release: Release) -> None:
        """The resident `keys` go back to the evictor with `release`, tail first (those whose
        store is in flight keep it for when it completes)."""
        chunks = self._chunks
        position = req_context.get_offload_key_position
        block_size = self.block_size
        records = []
        for key in keys:
            record = chunks.get(key)
            if record is not None:
                at = position(key)
                if at is not None:
                    record.depth = at // block_size - 1
                records.append(record)
        records.sort(key=_DEPTH, reverse=True)
        remove = self.evictor.remove
        for record in records:
            record.release = release
            if record.queued:
                remove(record.slot)
                record.queued = False
                self._num_queued -= 1
        self._push(records, release)

    def _push(self, records: list[_Chunk], release: Release | None) -> None:
        """One `push_cached` of the ready ones among `records` (tail first already)."""
        pushed = [record for record in records if record.ready and record.slot]
        if not pushed or release is None:
            return
        key_of = self._key_of
        slots = [record.slot for record in pushed]
        freed = FreedBlocks(slots, [record.depth for record in pushed], [key_of[s] for s in slots])
        self.evictor.push_cached(freed, release)
        for record in pushed:
            record.queued = True
        self._num_queued += len(pushed)

    def _drop(self, key: Any) -> _Chunk:
        """Forget a chunk (evicted, or removed by vLLM); its record says where it was."""
        record = self._chunks.pop(key)
        del self._status[key]
        self._pinned.discard(key)
        if record.slot:
            self._key_of[record.slot] = None
        else:
            self._num_slotless -= 1
        if record.queued:
            self._num_queued -= 1
        return record


def _conversation(req_context: Any) -> str:
    """The request's conversation as its context carries it, else its id."""
    params = getattr(req_context, "kv_transfer_params", None) or {}
    return params.get(CONVERSATION_KEY) or str(getattr(req_context, "req_id", ""))


_DEPTH = operator.attrgetter("depth")  # a key's depth: its end-token position // block_size - 1
