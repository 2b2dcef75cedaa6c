"""SGLang 0.5.23's real radix caches on CPU, driven the way its scheduler drives them.

Runs only in SGLang's own venv (scripts/setup_sglang_venv.sh); `sglang` is imported when a
cache is built, never at module import, so our venv can import this file's names.

`RealRadixCache` builds `RadixCache` or `UnifiedRadixCache` (the tree a served
full-attention model gets: `tree_components=(FULL,)`, Python tree core, the one that calls
an eviction strategy's `get_priority`) over a real `TokenToKVPoolAllocator` and
`MHATokenToKVPool` on `device="cpu"`, with the eviction policy looked up by name in SGLang's
own registry (`get_eviction_strategy`), so `"lpc"` is our strategy only after the plugin
registered it. Nothing of SGLang is reimplemented: inserts, matches, locks and the eviction
loop are SGLang's; this class only allocates KV slots, counts, and watches what is freed.

Time. `RadixCache` stamps nodes with `time.monotonic()`, `UnifiedRadixCache` with a logical
counter (`get_and_increase_time_counter`, +1 per node access). Both are replaced, while a
cache is open, by a `FakeClock` the caller sets (trace seconds), so runs are deterministic
and LPC's `scale_per_s` means per second in both trees; `close()` restores them.
`sglang_clock=True` keeps UnifiedRadixCache's own counter instead (as a served SGLang runs).

Request lifecycle (`arrive` / `complete`), as SGLang's scheduler does it: at arrival the
prompt less its last token is matched (`match_prefix`, which refreshes and may split the
matched path), the matched node is locked (`inc_lock_ref` / `lock`), and slots for the
rest of prompt + output are allocated, evicting (`evict(EvictParams(num_tokens=shortfall))`)
when the allocator is short; at completion the whole sequence is inserted with the
request's `priority` (p in parts per million) and the lock released. `RadixCache.insert`
leaves freeing the duplicate slots of an overlap to the caller (as `_insert_cache` does);
`UnifiedRadixCache.insert` frees them itself from `prev_prefix_len`.
"""

from __future__ import annotations

import importlib
import os
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RADIX = "radix"  # sglang.srt.mem_cache.radix_cache.RadixCache
UNIFIED = "unified"  # sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache
KINDS = (RADIX, UNIFIED)
REPO_ROOT = Path(__file__).resolve().parents[2]


def sglang_python_path() -> Path:
    """SGLang's python: `LPC_SGLANG_PYTHON`, or `.sglang-venv/bin/python` of this repository."""
    configured = os.environ.get("LPC_SGLANG_PYTHON")
    return Path(configured) if configured else REPO_ROOT / ".sglang-venv" / "bin" / "python"


class FakeClock:
    """The time both trees read while a cache is open; the caller moves `now`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Evicted:
    """One node SGLang evicted: its tokens (in order) and the fields the strategy read."""

    key: tuple[int, ...]
    priority: int
    last_access_time: float


@dataclass
class Held:
    """A request between arrival and completion: its lock and its KV slots."""

    tokens: tuple[int, ...]
    priority: int
    prefix_len: int
    slots: Any  # torch.Tensor: tree slots of the prefix, then the request's own
    lock: Any
    cache_salt: str | None = None


@dataclass
class Counters:
    """What a replay through the cache did (tokens are KV slots: page size 1)."""

    requests: int = 0
    queried_tokens: int = 0
    hit_tokens: int = 0
    hit_requests: int = 0
    evicted_nodes: int = 0
    evicted_tokens: int = 0
    allocation_failures: int = 0
    evict_calls: int = 0
    evict_requested_tokens: int = 0  # what allocations asked evict() for; less than evicted
    # Once the cache has first filled (evicted): arrivals, and the free slots after each,
    # summed: what whole-node evictions freed beyond the need, idle until later allocations.
    arrivals_after_first_eviction: int = 0
    free_slots_after_arrivals: int = 0


class RealRadixCache:
    """One of SGLang's radix caches with `capacity_tokens` KV slots (page size 1)."""

    def __init__(
        self,
        kind: str,
        capacity_tokens: int,
        eviction_policy: str = "lru",
        eviction_policy_config: dict[str, Any] | None = None,
        clock: FakeClock | None = None,
        sglang_clock: bool = False,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        import torch

        self._torch = torch
        self.kind = kind
        self.clock = clock or FakeClock()
        self._restore: list[Callable[[], None]] = []
        if sglang_clock:  # SGLang's own time: the tree core's counter (UnifiedRadixCache only)
            if kind != UNIFIED:
                raise ValueError("sglang_clock is for UnifiedRadixCache's tick counter")
        else:
            self._patch_time()
        self.freed: list[Any] | None = None  # slot tensors freed, while recording

        try:
            self._build(kind, capacity_tokens, eviction_policy, eviction_policy_config)
        except BaseException:
            self.close()  # a policy SGLang does not know must not leave its clock patched
            raise
        self.slot_token: dict[int, int] = {}
        self.counters = Counters()

    def _build(
        self,
        kind: str,
        capacity_tokens: int,
        eviction_policy: str,
        eviction_policy_config: dict[str, Any] | None,
    ) -> None:
        """The allocator, the KV pool and the cache (the clock is already SGLang's)."""
        import torch
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

        recorder = self

        class RecordingAllocator(TokenToKVPoolAllocator):
            """SGLang's allocator; every free is also noted, to see what an eviction took."""

            def free(self, free_index: Any) -> None:
                if recorder.freed is not None and free_index.numel():
                    recorder.freed.append(free_index.clone())
                super().free(free_index)

        pool = MHATokenToKVPool(
            size=capacity_tokens,
            page_size=1,
            dtype=torch.float16,
            head_num=1,
            head_dim=4,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
        )
        self.allocator = RecordingAllocator(
            size=capacity_tokens, dtype=torch.float16, device="cpu", kvcache=pool, need_sort=False
        )
        self.capacity_tokens = capacity_tokens
        common = {
            "disable": False,
            "req_to_token_pool": None,
            "token_to_kv_pool_allocator": self.allocator,
            "page_size": 1,
            "eviction_policy": eviction_policy,
            "eviction_policy_config": eviction_policy_config,
        }
        if kind == RADIX:
            from sglang.srt.mem_cache.radix_cache import RadixCache

            self.cache = RadixCache(CacheInitParams(**common))
        else:
            from sglang.srt.mem_cache.unified_cache.components import ComponentType
            from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

            self.cache = UnifiedRadixCache(
                CacheInitParams(
                    **common, tree_components=(ComponentType.FULL,), tree_core_backend="python"
                )
            )
            self._full = ComponentType.FULL
        self.strategy = (
            self.cache.eviction_strategy
            if kind == RADIX
            else self.cache.tree_core.eviction_strategy
        )

    # -- time ------------------------------------------------------------------------------
    def _patch_time(self) -> None:
        if self.kind == RADIX:
            module = importlib.import_module("sglang.srt.mem_cache.radix_cache")
            real_time = module.time
            fake = types.SimpleNamespace(
                monotonic=self.clock, perf_counter=real_time.perf_counter, time=real_time.time
            )
            module.time = fake
            self._restore.append(lambda: setattr(module, "time", real_time))
        else:
            module = importlib.import_module("sglang.srt.mem_cache.unified_cache.unified_tree_core")
            real_counter = module.get_and_increase_time_counter
            module.get_and_increase_time_counter = self.clock
            self._restore.append(
                lambda: setattr(module, "get_and_increase_time_counter", real_counter)
            )

    def close(self) -> None:
        while self._restore:
            self._restore.pop()()

    def __enter__(self) -> RealRadixCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the tree ----------------------------------------------------------------------------
    @property
    def root(self) -> Any:
        return self.cache.root_node if self.kind == RADIX else self.cache.tree_core.root_node

    def node_value(self, node: Any) -> Any:
        return node.value if self.kind == RADIX else node.component_data[self._full].value

    def evictable_leaves(self) -> list[Any]:
        if self.kind == RADIX:
            return list(self.cache.evictable_leaves)
        return list(self.cache.tree_core.evictable_device_leaves)

    def node_at(self, tokens: Sequence[int]) -> Any:
        """The node whose path from the root spells exactly `tokens` (None if none does)."""
        node, done = self.root, 0
        while done < len(tokens):
            child = node.children.get(tokens[done])
            if child is None:
                return None
            key = tuple(child.key.token_ids)
            if tuple(tokens[done : done + len(key)]) != key:
                return None
            node, done = child, done + len(key)
        return node

    def available_slots(self) -> int:
        return self.allocator.available_size()

    def evictable_tokens(self) -> int:
        return self.cache.evictable_size()

    def _key(self, tokens: Sequence[int], cache_salt: str | None = None) -> Any:
        from array import array

        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(array("q", tokens), cache_salt=cache_salt)

    def _match(self, tokens: Sequence[int], cache_salt: str | None = None) -> tuple[int, Any, Any]:
        """(matched tokens, the node to lock, the matched path's slots) via `match_prefix`."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        if not tokens:
            return 0, None, self._torch.empty((0,), dtype=self._torch.int64)
        result = self.cache.match_prefix(MatchPrefixParams(key=self._key(tokens, cache_salt)))
        node = result.last_device_node
        slots = self.cache.path_device_indices(node)
        assert len(slots) == result.device_prefix_len, (len(slots), result.device_prefix_len)
        return result.device_prefix_len, node, slots

    def _lock(self, node: Any) -> Any:
        if node is None:
            return None
        if self.kind == RADIX:
            self.cache.inc_lock_ref(node)
            return node
        return self.cache.lock(node)

    def _unlock(self, lock: Any) -> None:
        if lock is None:
            return
        if self.kind == RADIX:
            self.cache.dec_lock_ref(lock)
        else:
            self.cache.unlock(lock)

    def _alloc(self, tokens: Sequence[int]) -> Any:
        """Slots for `tokens`, evicting SGLang's way when short; None if even that fails."""
        need = len(tokens)
        if need == 0:
            return self._torch.empty((0,), dtype=self._torch.int64)
        short = need - self.allocator.available_size()
        if short > 0:
            self._evict_counting(short)
        slots = self.allocator.alloc(need)
        if slots is None:
            return None
        for slot, token in zip(slots.tolist(), tokens, strict=True):
            self.slot_token[slot] = token
        return slots

    # -- operations ----------------------------------------------------------------------
    def arrive(
        self,
        tokens: Sequence[int],
        prompt_len: int,
        priority: int,
        cache_salt: str | None = None,
    ) -> Held | None:
        """A request arrives: match, lock, allocate the rest (None: it cannot be held).

        `cache_salt` namespaces the request's tree path as SGLang's `RadixKey` does."""
        tokens = tuple(tokens)
        c = self.counters
        c.requests += 1
        c.queried_tokens += prompt_len
        prefix_len, node, prefix_slots = self._match(tokens[: max(prompt_len - 1, 0)], cache_salt)
        lock = self._lock(node)
        own = self._alloc(tokens[prefix_len:])
        if own is None:
            self._unlock(lock)
            c.allocation_failures += 1
            return None
        c.hit_tokens += prefix_len
        c.hit_requests += prefix_len > 0
        if c.evict_calls:
            c.arrivals_after_first_eviction += 1
            c.free_slots_after_arrivals += self.allocator.available_size()
        slots = self._torch.cat((prefix_slots, own))
        return Held(tokens, priority, prefix_len, slots, lock, cache_salt)

    def complete(self, held: Held) -> None:
        """The request finishes: insert its whole sequence with its priority, then unlock."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        params = InsertParams(
            key=self._key(held.tokens, held.cache_salt),
            value=held.slots.clone(),
            priority=held.priority,
            prev_prefix_len=held.prefix_len,
        )
        result = self.cache.insert(params)
        if self.kind == RADIX:  # RadixCache leaves the overlap's duplicate slots to its caller
            self.allocator.free(held.slots[held.prefix_len : result.prefix_len])
        self._unlock(held.lock)

    def insert(self, tokens: Sequence[int], priority: int = 0) -> None:
        """Cache `tokens` as one request would (arrive with no output, then complete)."""
        held = self.arrive(tokens, len(tokens), priority)
        if held is None:
            raise RuntimeError(f"{len(tokens)} tokens do not fit in the cache")
        self.complete(held)

    def match(self, tokens: Sequence[int]) -> int:
        """A bare `match_prefix` (refreshes and may split); the matched length."""
        return self._match(tuple(tokens))[0]

    def lock(self, tokens: Sequence[int]) -> Any:
        """Lock the node at the end of `tokens`' cached prefix, as a running request does."""
        return self._lock(self._match(tuple(tokens))[1])

    def unlock(self, lock: Any) -> None:
        self._unlock(lock)

    def _evicted_from(self, freed: list[Any], nodes: dict[int, Any]) -> list[Evicted]:
        out = []
        for slots in freed:
            first = int(slots[0])
            node = nodes.get(first)
            out.append(
                Evicted(
                    tuple(self.slot_token[s] for s in slots.tolist()),
                    node.priority if node is not None else 0,
                    node.last_access_time if node is not None else float("nan"),
                )
            )
        return out

    def _first_slots(self) -> dict[int, Any]:
        """Every cached node by the first slot of its value, to name what a free took."""
        out, stack = {}, [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            value = self.node_value(node) if node is not self.root else None
            if value is not None and len(value):
                out[int(value[0])] = node
        return out

    def _evict_counting(self, num_tokens: int) -> None:
        """SGLang's eviction for an allocation, counted but not named (the replay's path)."""
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        self.freed = []
        try:
            result = self.cache.evict(EvictParams(num_tokens=num_tokens))
        finally:
            freed, self.freed = self.freed, None
        self.counters.evict_calls += 1
        self.counters.evict_requested_tokens += num_tokens
        self.counters.evicted_nodes += len(freed)
        self.counters.evicted_tokens += result.num_tokens_evicted

    def evict(
        self, num_tokens: int, observe: Callable[[Evicted, list[Any]], None] | None = None
    ) -> list[Evicted]:
        """SGLang's `evict(EvictParams(num_tokens))`; what it freed, in order.

        With `observe`, eviction goes one node at a time (`num_tokens=1` per call, which
        rebuilds SGLang's heap from its evictable-leaf set each time: the same order) and
        `observe(victim, candidates)` sees each choice among the evictable leaves.
        """
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        evicted: list[Evicted] = []
        if observe is None:
            nodes = self._first_slots()
            self.freed = []
            try:
                self.cache.evict(EvictParams(num_tokens=num_tokens))
                self.counters.evict_calls += 1
            finally:
                freed, self.freed = self.freed, None
            evicted = self._evicted_from(freed, nodes)
        else:
            done = 0
            while done < num_tokens and self.evictable_leaves():
                candidates = self.evictable_leaves()
                nodes = self._first_slots()
                self.freed = []
                try:
                    self.cache.evict(EvictParams(num_tokens=1))
                    self.counters.evict_calls += 1
                finally:
                    freed, self.freed = self.freed, None
                step = self._evicted_from(freed, nodes)
                assert len(step) == 1, f"one evict(1) freed {len(step)} segments"
                observe(step[0], candidates)
                evicted.extend(step)
                done += len(step[0].key)
        self.counters.evicted_nodes += len(evicted)
        self.counters.evicted_tokens += sum(len(e.key) for e in evicted)
        return evicted
