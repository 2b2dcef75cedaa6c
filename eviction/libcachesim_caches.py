"""LRB and 3L-Cache, the learned CDN caches, run on the block stream behind the evictor contract.

libCacheSim's own implementations (`libcachesim` on PyPI, 0.3.x; extra `lpc[rivals]`), with
libCacheSim's default parameters: a release is one request per block under an object id that
stays with the block's content, and each pop is the cache's own choice. This module is also
the one place of the workaround for libCacheSim 0.3.5's crash when such a cache is freed.

What each cache sees, what it cannot, and the crash: docs/design.md, "LRB and 3L-Cache through
libCacheSim".
"""

from __future__ import annotations

import ctypes
import functools
import os
import weakref
from array import array
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from eviction.base import Evictor, FreedBlocks, FreeFlags, Release
from eviction.linked_list import BlockList

INSTALL_HINT = "pip install 'lpc[rivals]' (libcachesim)"
NO_OBJECT = -1
# Far above any pool: the learned cache never evicts on its own.
_UNBOUNDED_BYTES = 1 << 50
# pybind11 keeps a simple instance's value pointer right after the object header.
_PYBIND_VALUE_OFFSET = 16
_PROBE_WORDS = 64


def _libcachesim() -> Any:
    try:
        import libcachesim
    except ImportError:
        raise ModuleNotFoundError(
            f"the learned CDN caches (lrb, 3l-cache) need libcachesim: {INSTALL_HINT}",
            name="libcachesim",
        ) from None
    return libcachesim


def _address(pybind_object: object) -> int:
    return ctypes.c_void_p.from_address(id(pybind_object) + _PYBIND_VALUE_OFFSET).value or 0


@functools.cache
def _candidate_offset(cache_class: str) -> int:
    """The byte offset of `to_evict_candidate` in libCacheSim's `cache_t`: the one word of a
    probe cache that `to_evict` sets to the very object it returns."""
    lcs = _libcachesim()
    probe = getattr(lcs, cache_class)(8)
    raw = probe._cache
    for obj_id in range(4):
        probe.get(lcs.Request(obj_size=1, obj_id=obj_id, clock_time=obj_id))
    base = _address(raw)
    before = [ctypes.c_uint64.from_address(base + 8 * i).value for i in range(_PROBE_WORDS)]
    victim = probe.to_evict(lcs.Request(obj_size=1, obj_id=99, clock_time=9))
    target = _address(victim)
    after = [ctypes.c_uint64.from_address(base + 8 * i).value for i in range(_PROBE_WORDS)]
    changed = [i for i in range(_PROBE_WORDS) if before[i] != after[i] and after[i] == target]
    if len(changed) != 1 or not target:
        raise RuntimeError(
            f"libcachesim {getattr(lcs, '__version__', '?')}: cannot locate {cache_class}'s "
            "eviction candidate slot, so freeing the cache could abort the process; "
            "use libcachesim 0.3.5"
        )
    slot = _CandidateSlot(raw, 8 * changed[0])
    slot.original = before[changed[0]]
    slot.release()  # the probe is freed safely, or the process stops here, not in a replay
    return 8 * changed[0]


class _CandidateSlot:
    """Restores a libCacheSim cache's `to_evict_candidate` to the pointer its `init`
    allocated, so that the cache's `free` frees that pointer and not one into its
    parameters (docs/design.md, "LRB and 3L-Cache through libCacheSim")."""

    def __init__(self, raw: object, offset: int) -> None:
        self._raw: object | None = raw
        self._word = _address(raw) + offset
        self.original = ctypes.c_uint64.from_address(self._word).value

    def release(self) -> None:
        if self._raw is not None:
            ctypes.c_uint64.from_address(self._word).value = self.original
            self._raw = None  # the last reference: the cache is freed now, safely


class LearnedCacheEvictor(FreeFlags, Evictor):
    """Uncached blocks first (reused LIFO), then the learned cache's choices among free
    cached blocks. Subclasses name the libCacheSim class and its parameters."""

    name: ClassVar[str] = "learned-cache"
    CACHE_CLASS: ClassVar[str] = ""

    def __init__(self, num_blocks: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"{self.name}: num_blocks must be an int >= 0, got {num_blocks!r}")
        self._num_blocks = num_blocks
        self._lcs = _libcachesim()
        self._uncached = BlockList(num_blocks)
        self._cache: Any = None
        self._slot: _CandidateSlot | None = None
        self._clear()

    # -- the learned cache ------------------------------------------------------------
    def cache_parameters(self) -> dict[str, Any]:
        """Keyword arguments of the libCacheSim class beyond its size (its defaults)."""
        return {}

    def _new_cache(self) -> Any:
        offset = _candidate_offset(self.CACHE_CLASS)
        cache = getattr(self._lcs, self.CACHE_CLASS)(_UNBOUNDED_BYTES, **self.cache_parameters())
        slot = _CandidateSlot(cache._cache, offset)
        self._slot = slot
        weakref.finalize(self, slot.release)
        return cache

    def close(self) -> None:
        """Free the learned cache now (it is also freed when the evictor is collected)."""
        if self._slot is not None:
            self._slot.release()
            self._slot = None
        self._cache = None

    def __reduce__(self) -> Any:
        raise TypeError(f"{self.name}: a libCacheSim cache cannot be copied or pickled")

    def _clear(self) -> None:
        n = self._num_blocks
        self.close()
        self._obj_of_block = [NO_OBJECT] * n  # the object id of the block's cached content
        self._block_of_obj: dict[int, int] = {}  # object id -> the block holding it
        self._free = [False] * n  # cached and free: a candidate
        self._num_free = 0
        self._obj_of_hash: dict[bytes, int] = {}
        self._next_obj = 0
        self._request = self._lcs.Request(obj_size=1)
        self._changes = 0  # state changes so far: a dry run's order is reused until the next
        self._dry_run: tuple[int, list[int]] | None = None

    def _object_for(self, block_id: int, block_hash: bytes | None) -> int:
        obj = self._obj_of_block[block_id]
        if obj != NO_OBJECT:
            return obj
        obj = NO_OBJECT if block_hash is None else self._obj_of_hash.get(block_hash, NO_OBJECT)
        if obj == NO_OBJECT or obj in self._block_of_obj:  # no hash, or two blocks of it
            obj = self._next_obj
            self._next_obj += 1
            if block_hash is not None and block_hash not in self._obj_of_hash:
                self._obj_of_hash[block_hash] = obj
        self._obj_of_block[block_id] = obj
        self._block_of_obj[obj] = block_id
        return obj

    def _access(self, freed: FreedBlocks, release: Release, idle: bool) -> None:
        if not len(freed):
            return
        self._changes += 1
        cache = self._cache
        if cache is None:
            cache = self._cache = self._new_cache()
        request = self._request
        request.clock_time = max(0, int(release.time_s))
        free = self._free
        for block_id, block_hash in zip(freed.block_ids, freed.hashes, strict=True):
            request.obj_id = self._object_for(block_id, block_hash)
            cache.get(request)
            if idle:
                free[block_id] = True
        if idle:
            self._num_free += len(freed)

    def _evict(self, now_s: float) -> int:
        """The learned cache's next choice that is a free cached block."""
        cache, request, free = self._cache, self._request, self._free
        request.clock_time = max(0, int(now_s))
        while True:
            assert cache is not None and cache.get_n_obj() > 0, (
                f"{self.name}: {self._num_free} free cached blocks but the learned cache is empty"
            )
            obj = cache.to_evict(request).obj_id
            cache.evict(request)
            block_id = self._block_of_obj.get(obj)
            if block_id is None or not free[block_id]:
                continue  # stale content or a block in use: out of the learned cache only
            free[block_id] = False
            self._num_free -= 1
            self._forget(block_id)
            return block_id

    def _forget(self, block_id: int) -> None:
        obj = self._obj_of_block[block_id]
        if obj != NO_OBJECT:
            del self._block_of_obj[obj]
            self._obj_of_block[block_id] = NO_OBJECT

    # -- the evictor contract -------------------------------------------------------------
    def reset(self, block_ids: Iterable[int]) -> None:
        self._uncached.clear_to(block_ids)
        self._clear()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        self._changes += 1
        for block_id in block_ids:
            self._forget(block_id)  # its content left without an eviction
        self._uncached.prepend_n(block_ids)

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        self._access(freed, release, idle=True)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        self._access(freed, release, idle=False)

    def remove(self, block_id: int) -> None:
        self._changes += 1
        if self._free[block_id]:
            self._free[block_id] = False
            self._num_free -= 1
        else:
            self._uncached.remove(block_id)

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        uncached = self._uncached
        from_uncached = min(n, uncached.size)
        if n > from_uncached + self._num_free:
            raise IndexError(f"cannot pop {n} blocks: only {len(self)} are free")
        self._changes += 1
        out = uncached.pop_n(from_uncached)
        for _ in range(n - from_uncached):
            out.append(self._evict(now_s))
        return out

    def free_block_ids(self) -> list[int]:
        """Uncached blocks, then the learned cache's choices, found by evicting in a forked
        copy of the process (a libCacheSim cache cannot be copied), once per state. For
        tests; POSIX only."""
        head = list(self._uncached)
        if not self._num_free:
            return head
        if self._dry_run is not None and self._dry_run[0] == self._changes:
            return [*head, *self._dry_run[1]]
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: evict everything, report the order, exit without cleanup
            try:
                os.close(read_end)
                order = array("q", (self._evict(0.0) for _ in range(self._num_free)))
                with os.fdopen(write_end, "wb") as out:
                    out.write(order.tobytes())
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as source:
            data = source.read()
        os.waitpid(pid, 0)
        order = array("q")
        order.frombytes(data)
        assert len(order) == self._num_free, f"{self.name}: the dry run evicted {len(order)}"
        self._dry_run = (self._changes, order.tolist())
        return [*head, *order]

    def check_invariants(self) -> None:
        Evictor.check_invariants(self)
        self._uncached.check_invariants()
        free = self._free
        assert sum(free) == self._num_free, f"{self.name}: the free count is out of sync"
        for obj, block_id in self._block_of_obj.items():
            assert self._obj_of_block[block_id] == obj, f"{self.name}: block {block_id}'s object"
        for block_id in range(self._num_blocks):
            if free[block_id]:
                assert self._obj_of_block[block_id] != NO_OBJECT, (
                    f"{self.name}: free cached block {block_id} has no object"
                )
                assert block_id not in self._uncached, f"{self.name}: block {block_id} twice"
        if self._num_free:
            assert self._cache.get_n_obj() >= self._num_free, (
                f"{self.name}: the learned cache holds fewer objects than free cached blocks"
            )


class LRBEvictor(LearnedCacheEvictor):
    """LRB (NSDI'20) from libCacheSim, on the block stream."""

    name: ClassVar[str] = "lrb"
    CACHE_CLASS: ClassVar[str] = "LRB"

    def cache_parameters(self) -> dict[str, Any]:
        return {"objective": "object-miss-ratio"}  # unit-size blocks: the same as bytes


class ThreeLCacheEvictor(LearnedCacheEvictor):
    """3L-Cache (FAST'25) from libCacheSim, on the block stream."""

    name: ClassVar[str] = "3l-cache"
    CACHE_CLASS: ClassVar[str] = "ThreeLCache"

    def cache_parameters(self) -> dict[str, Any]:
        return {"objective": "object-miss-ratio"}
