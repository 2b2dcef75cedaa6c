"""LPC as a vLLM 0.33 `CachePolicy`: the eviction order of vLLM's CPU offload tier.

vLLM 0.33's `CPUOffloadingManager` (`vllm/v1/kv_offload/cpu/manager.py`) delegates the order
of its CPU chunks to a `CachePolicy` (`vllm/v1/kv_offload/cpu/policies/base.py`) that
`CachePolicyFactory` resolves by name; a name it does not know is imported from
`cache_policy_module_path`. So LPC needs no patch here, only two settings of the
`OffloadingConnector`:

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"cpu_bytes_to_use": ..., "eviction_policy":
      "LPCCachePolicy", "cache_policy_module_path": "lpc.integrations.vllm_cache_policy"}}'

`LPCCachePolicy` orders chunks with `eviction.lpc.LPCEvictor`, `LPCPooledCachePolicy` with
`eviction.lpc_pooled.PooledLPCEvictor`. A request's continuation probability and
conversation come from its `kv_transfer_params` (`lpc_probability`, `lpc_conversation_id`);
a missing or invalid probability takes the evictor's fallback, so eviction never waits.

How the hooks map onto the evictor contract (`eviction/base.py`): the evictor holds exactly
the evictable chunks (reference count 0); each chunk has a slot id for it. `insert` gives the
chunk a slot and, once the store completes (`mark_evictable`), hands it to the evictor with
its depth (the key's end-token position: only the order of depths matters) and the storing
request's release; `mark_non_evictable` (a load pins it) takes it out. `touch` and
`on_request_finished` re-release a request's chunks tail first with its probability: the
finish is where vLLM hands a policy the request. `evict(n, protected)` checks first that n
unprotected chunks are evictable (else `None`, no change: vLLM's atomic contract), takes the
protected ones out, pops n, and puts the protected ones back with their last release.

The vLLM classes are built on first access (a module `__getattr__`), so this module imports
vLLM only inside the engine that asks for them; `EvictorCachePolicy` holds the logic and runs
without vLLM.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from eviction import FreedBlocks, Release, make_evictor
from lpc.integrations.stats import is_probability

# vLLM class name -> the evictor of `eviction.POLICIES` that orders the chunks
CACHE_POLICY_EVICTORS = {"LPCCachePolicy": "lpc", "LPCPooledCachePolicy": "lpc-pooled"}


@dataclass(slots=True)
class _Chunk:
    """What the policy keeps per resident chunk: vLLM's status object, its evictor slot and
    the release it goes back to the evictor with."""

    status: Any
    slot: int
    depth: int
    release: Release
    evictable: bool = False


def request_release(req_context: Any, now_s: float) -> Release:
    """The release a request's chunks get: its `kv_transfer_params`' probability (when it is
    a number in [0, 1]) and conversation id, else none (the evictor's fallback) and its id."""
    params = getattr(req_context, "kv_transfer_params", None) or {}
    p = params.get("lpc_probability") if isinstance(params, dict) else None
    conversation = params.get("lpc_conversation_id") if isinstance(params, dict) else None
    return Release(
        now_s,
        float(p) if is_probability(p) else None,
        str(conversation) if conversation else str(getattr(req_context, "req_id", "")),
    )


class EvictorCachePolicy:
    """vLLM's `CachePolicy` methods over an evictor of `eviction/` (see the module)."""

    def __init__(
        self,
        cache_capacity: int,
        evictor: str = "lpc",
        clock: Callable[[], float] = time.monotonic,
        **evictor_options: Any,
    ) -> None:
        if cache_capacity < 1:
            raise ValueError(f"cache_capacity must be >= 1, got {cache_capacity}")
        self.cache_capacity = cache_capacity
        self._evictor_name = evictor
        self._evictor_options = evictor_options
        self._clock = clock
        self._chunks: dict[Any, _Chunk] = {}
        self._key_of: dict[int, Any] = {}
        self._free_slots: list[int] = []
        self.clear()

    # -- CachePolicy ----------------------------------------------------------------------
    def get(self, key: Any) -> Any:
        chunk = self._chunks.get(key)
        return None if chunk is None else chunk.status

    def insert(self, key: Any, chunk: Any, req_context: Any) -> None:
        if not self._free_slots:
            raise RuntimeError(f"insert beyond the capacity of {self.cache_capacity} chunks")
        slot = self._free_slots.pop()
        position = req_context.get_offload_key_position(key)
        depth = 0 if position is None else int(position)
        record = _Chunk(chunk, slot, depth, request_release(req_context, self._clock()))
        self._chunks[key] = record
        self._key_of[slot] = key
        if chunk.ref_cnt == 0:
            self._push([key])

    def remove(self, key: Any) -> None:
        record = self._chunks.pop(key)
        if record.evictable:
            self.evictor.remove(record.slot)
        del self._key_of[record.slot]
        self._free_slots.append(record.slot)

    def touch(self, keys: Iterable[Any], req_context: Any) -> None:
        self._rerelease(list(keys), request_release(req_context, self._clock()))

    def on_store_miss(self, keys: Iterable[Any], req_context: Any) -> None:
        """A miss holds nothing to reorder (the keys are not resident yet)."""
        return None

    def on_request_access(self, keys: Iterable[Any], req_context: Any) -> None:
        return None

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[Any]],
        insertion_only_keys: set[Any],
        reused_keys: set[Any],
        req_context: Any,
    ) -> None:
        release = request_release(req_context, self._clock())
        for keys in key_groups:
            self._rerelease(list(keys), release)

    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, Any]] | None:
        if n == 0:
            return []
        shielded = [k for k in protected if k in self._chunks and self._chunks[k].evictable]
        if len(self.evictor) - len(shielded) < n:
            return None
        for key in shielded:
            self.evictor.remove(self._chunks[key].slot)
            self._chunks[key].evictable = False
        slots = self.evictor.pop_n(n, self._clock())
        evicted = []
        for slot in slots:
            key = self._key_of.pop(slot)
            record = self._chunks.pop(key)
            self._free_slots.append(slot)
            evicted.append((key, record.status))
        self._push(shielded)
        return evicted

    def clear(self) -> None:
        self._chunks.clear()
        self._key_of.clear()
        self._free_slots = list(range(self.cache_capacity, 0, -1))
        self.evictor = make_evictor(
            self._evictor_name, self.cache_capacity + 1, **self._evictor_options
        )
        self.evictor.reset([])

    def mark_evictable(self, key: Any) -> None:
        self._push([key])

    def mark_non_evictable(self, key: Any) -> None:
        record = self._chunks[key]
        if record.evictable:
            self.evictor.remove(record.slot)
            record.evictable = False

    # -- internals --------------------------------------------------------------------------
    def _rerelease(self, keys: list[Any], release: Release) -> None:
        """Give `keys` (head to tail) the request's release; evictable ones go back to the
        evictor tail first, pinned ones keep it for when they become evictable."""
        resident = [k for k in keys if k in self._chunks]
        for key in resident:
            self._chunks[key].release = release
        evictable = [k for k in resident if self._chunks[k].evictable]
        for key in evictable:
            self.evictor.remove(self._chunks[key].slot)
            self._chunks[key].evictable = False
        self._push(evictable)

    def _push(self, keys: list[Any]) -> None:
        """Hand `keys` to the evictor tail first, grouped by their release."""
        records = [self._chunks[k] for k in keys if not self._chunks[k].evictable]
        records.sort(key=lambda r: -r.depth)
        by_release: dict[int, list[_Chunk]] = {}
        releases: dict[int, Release] = {}
        for record in records:
            by_release.setdefault(id(record.release), []).append(record)
            releases[id(record.release)] = record.release
        for rid, group in by_release.items():
            slots = [r.slot for r in group]
            keys = [self._key_of[slot] for slot in slots]
            freed = FreedBlocks(slots, [r.depth for r in group], keys)
            self.evictor.push_cached(freed, releases[rid])
            for record in group:
                record.evictable = True


@functools.cache
def vllm_class(name: str) -> type:
    """The subclass of vLLM's `CachePolicy` named `name`, running `EvictorCachePolicy` with
    the evictor `CACHE_POLICY_EVICTORS[name]`; one class per name."""
    from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

    evictor = CACHE_POLICY_EVICTORS[name]

    def __init__(self: Any, cache_capacity: int) -> None:
        CachePolicy.__init__(self, cache_capacity)
        EvictorCachePolicy.__init__(self, cache_capacity, evictor)

    namespace = {
        "__init__": __init__,
        "__doc__": f"vLLM's CPU offload tier ordered by eviction's {evictor!r} evictor.",
        "__module__": __name__,
    }
    # EvictorCachePolicy first: its methods implement CachePolicy's abstract ones.
    return type(name, (EvictorCachePolicy, CachePolicy), namespace)


def __getattr__(name: str) -> type:
    """`CachePolicyFactory` does `getattr(module, eviction_policy)`: build the class then."""
    if name not in CACHE_POLICY_EVICTORS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return vllm_class(name)
