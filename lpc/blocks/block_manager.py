"""A prefix-caching KV block manager with vLLM v1 semantics and a pluggable evictor.

The pool is preallocated; block 0 is the null block (never handed out), so N blocks give N−1
usable ones. A request's full blocks are hashed in a chain and cached as soon as they are
allocated; a later request reuses the longest cached prefix of its prompt. Freed blocks go to
the evictor tail-first, blocks without a hash ahead of everything; a cached block loses its
hash only when the evictor hands it out again (lazy eviction). With the `lru` evictor this is
block for block what vLLM's `BlockPool` + `KVCacheManager` do, which a differential test
against vLLM 0.33.0 checks.

A request-level caller makes three calls per request:

    prefix = manager.find_computed_prefix(request)
    allocation = manager.allocate(request, prefix, now_s)   # None when the pool is too full
    ...
    manager.free(request.request_id, now_s, probability)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from eviction import (
    Evictor,
    FreedBlocks,
    LRUEvictor,
    Release,
    ReturnCurveLike,
    check_probability,
)
from lpc.blocks.hashing import BlockHash, BlockHasher, MultiModalSpan

NULL_BLOCK_ID = 0


class UnknownRequestError(KeyError):
    """A request id the manager does not hold blocks for."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else "unknown request"


@dataclass(frozen=True, slots=True)
class CacheRequest:
    """One request's token sequence as the block manager sees it.

    `token_ids` is the whole sequence the request will hold in the KV cache (prompt, then
    output); only the first `num_prompt_tokens` are looked up in the prefix cache. Extra keys
    (`cache_salt`, `lora_id`, `mm_spans`) make blocks unique beyond their tokens. When the
    caller already computed the sequence's block hashes with the manager's hasher it may pass
    them in `block_hashes` (a replay harness hashes a trace once for every policy).
    """

    request_id: str
    token_ids: Sequence[int]
    num_prompt_tokens: int
    conversation_id: str | None = None
    cache_salt: str | None = None
    lora_id: str | int | None = None
    mm_spans: tuple[MultiModalSpan, ...] = ()
    block_hashes: Sequence[BlockHash] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty str, got {self.request_id!r}")
        n = self.num_prompt_tokens
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"num_prompt_tokens must be an int, got {type(n).__name__}")
        if not 1 <= n <= len(self.token_ids):
            raise ValueError(
                f"request {self.request_id}: num_prompt_tokens must be in "
                f"[1, len(token_ids)={len(self.token_ids)}], got {n}"
            )


@dataclass(frozen=True, slots=True)
class ComputedPrefix:
    """The cached blocks a request can reuse: a contiguous prefix of its prompt."""

    request_id: str
    block_ids: tuple[int, ...]
    block_hashes: tuple[BlockHash, ...]
    num_tokens: int
    state_version: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """What `allocate` did: the request's block table, its hits and the blocks it evicted."""

    block_ids: tuple[int, ...]
    num_hit_tokens: int
    num_new_blocks: int
    evicted_block_ids: tuple[int, ...]


@dataclass(slots=True)
class CacheCounters:
    """Running totals, in the units vLLM reports its prefix-cache hit rate in."""

    requests: int = 0
    hit_requests: int = 0
    queried_tokens: int = 0
    hit_tokens: int = 0
    allocated_blocks: int = 0
    evictions: int = 0
    allocation_failures: int = 0
    freed_requests: int = 0

    @property
    def token_hit_ratio(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


@dataclass(slots=True)
class _Held:
    """Book-keeping for a request that holds blocks."""

    block_ids: list[int]
    conversation_id: str | None
    hashes: list[BlockHash] = field(default_factory=list)


class PrefixCacheBlockManager:
    """Preallocated KV block pool with a hash → block prefix cache and a pluggable evictor."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        evictor: Evictor | None = None,
        hash_algorithm: str = "sha256",
        max_model_len: int | None = None,
    ) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(
                f"num_blocks must be an int >= 2 (block 0 is the null block), got {num_blocks!r}"
            )
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if max_model_len is not None and (
            isinstance(max_model_len, bool)
            or not isinstance(max_model_len, int)
            or max_model_len <= 0
        ):
            raise ValueError(f"max_model_len must be a positive int or None, got {max_model_len!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.hasher = BlockHasher(block_size, hash_algorithm)
        self.evictor: Evictor = evictor if evictor is not None else LRUEvictor(num_blocks)
        self.counters = CacheCounters()
        self._ref_count = [0] * num_blocks
        self._block_hash: list[BlockHash | None] = [None] * num_blocks
        # The hash of each cached block's parent (None: the first block of its sequence):
        # what the prefix-closure check asks of the cache.
        self._parent_hash: list[BlockHash | None] = [None] * num_blocks
        # hash -> one block id, or an insertion-ordered dict of duplicate block ids (vLLM's
        # append-only block tables can cache identical content twice).
        self._cached: dict[BlockHash, int | dict[int, None]] = {}
        self._held: dict[str, _Held] = {}
        self._version = 0
        self.evictor.reset(range(num_blocks))
        null = self.evictor.pop()
        if null != NULL_BLOCK_ID:
            raise RuntimeError(f"evictor handed out block {null} first; expected the null block 0")

    # -- queries ------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: unused ones plus evictable cached ones."""
        return len(self.evictor)

    @property
    def num_cached_blocks(self) -> int:
        return sum(1 for h in self._block_hash if h is not None)

    def active_request_ids(self) -> list[str]:
        return list(self._held)

    def blocks_of(self, request_id: str) -> list[int]:
        return list(self._require(request_id).block_ids)

    def ref_count(self, block_id: int) -> int:
        return self._ref_count[block_id]

    def block_hash(self, block_id: int) -> BlockHash | None:
        return self._block_hash[block_id]

    def cached_block(self, block_hash: BlockHash) -> int | None:
        """The block a lookup of `block_hash` would hit (the earliest cached duplicate)."""
        entry = self._cached.get(block_hash)
        if entry is None or isinstance(entry, int):
            return entry
        return next(iter(entry))

    def cached_hashes(self) -> dict[BlockHash, list[int]]:
        """Every cached hash with its blocks (for tests and debugging)."""
        return {
            h: ([entry] if isinstance(entry, int) else list(entry))
            for h, entry in self._cached.items()
        }

    def block_hashes_of(self, request: CacheRequest) -> list[BlockHash]:
        """The hashes of every full block of the request's sequence."""
        if request.block_hashes is not None:
            return list(request.block_hashes)
        return self.hasher.hash_sequence(
            request.token_ids, request.cache_salt, request.lora_id, request.mm_spans
        )

    # -- the three calls ----------------------------------------------------------------
    def find_computed_prefix(
        self, request: CacheRequest, block_hashes: Sequence[BlockHash] | None = None
    ) -> ComputedPrefix:
        """The longest cached prefix of the prompt, leaving at least one token to compute.

        Like vLLM, a fully cached prompt still recomputes its last token (to get logits), so
        the hit is capped at num_prompt_tokens − 1 and rounded down to whole blocks.
        """
        hashes = list(block_hashes) if block_hashes is not None else self.block_hashes_of(request)
        max_blocks = (request.num_prompt_tokens - 1) // self.block_size
        blocks: list[int] = []
        cached = self._cached
        for h in hashes[:max_blocks]:
            entry = cached.get(h)
            if entry is None:
                break
            blocks.append(entry if isinstance(entry, int) else next(iter(entry)))
        return ComputedPrefix(
            request_id=request.request_id,
            block_ids=tuple(blocks),
            block_hashes=tuple(hashes),
            num_tokens=len(blocks) * self.block_size,
            state_version=self._version,
        )

    def allocate(
        self, request: CacheRequest, prefix: ComputedPrefix | None = None, now_s: float = 0.0
    ) -> Allocation | None:
        """Give the request blocks for its whole sequence, reusing the cached prefix.

        Returns None, and changes nothing but the failure counter, when the pool cannot hold
        the request. Full blocks are cached immediately, so requests in the same step share.
        """
        rid = request.request_id
        if rid in self._held:
            raise ValueError(f"request {rid!r} already holds blocks; free it before reallocating")
        num_tokens = len(request.token_ids)
        if self.max_model_len is not None and num_tokens > self.max_model_len:
            raise ValueError(
                f"request {rid!r} has {num_tokens} tokens, more than max_model_len "
                f"{self.max_model_len}"
            )
        if prefix is None or prefix.request_id != rid:
            prefix = self.find_computed_prefix(request)
        elif prefix.state_version != self._version:
            # The pool changed since the lookup: look up again (the hashes are still valid).
            prefix = self.find_computed_prefix(request, prefix.block_hashes)
        computed = prefix.block_ids
        ref = self._ref_count
        num_required = -(-num_tokens // self.block_size)
        num_new = num_required - len(computed)
        num_evictable_hits = [ref[b] for b in computed].count(0)
        if num_new + num_evictable_hits > len(self.evictor):
            self.counters.allocation_failures += 1
            return None

        evictor = self.evictor
        for b in computed:
            if ref[b] == 0:
                evictor.remove(b)
            ref[b] += 1
        new_blocks = evictor.pop_n(num_new, now_s) if num_new > 0 else []
        evicted: list[int] = []
        block_hash = self._block_hash
        cached = self._cached
        for b in new_blocks:
            h = block_hash[b]
            if h is not None:  # `_uncache(b)`, inlined
                block_hash[b] = None
                entry = cached.get(h)
                if entry is not None:
                    if isinstance(entry, int):
                        if entry == b:
                            del cached[h]
                    else:
                        entry.pop(b, None)
                        if not entry:
                            del cached[h]
                evicted.append(b)
            ref[b] = 1
        table = [*computed, *new_blocks]

        hashes = prefix.block_hashes
        num_full = min(num_tokens // self.block_size, len(hashes))
        parent_hash = self._parent_hash
        start = len(computed)
        # each new full block with its hash and its parent's (None before the first block)
        parents = hashes[start - 1 : num_full - 1] if start else [None, *hashes[: num_full - 1]]
        # (not strict: with no full block, `parents` still holds the None before the first)
        news = zip(table[start:num_full], hashes[start:num_full], parents, strict=False)
        for b, h, parent in news:
            # New blocks carry no hash yet; cache them (duplicates allowed, like vLLM).
            block_hash[b] = h
            parent_hash[b] = parent
            entry = cached.get(h)
            if entry is None:
                cached[h] = b
            elif isinstance(entry, int):
                cached[h] = {entry: None, b: None}
            else:
                entry[b] = None

        self._held[rid] = _Held(table, request.conversation_id or rid, list(hashes[:num_full]))
        self._version += 1
        c = self.counters
        c.requests += 1
        c.queried_tokens += request.num_prompt_tokens
        c.hit_tokens += prefix.num_tokens
        c.hit_requests += prefix.num_tokens > 0
        c.allocated_blocks += len(new_blocks)
        c.evictions += len(evicted)
        return Allocation(tuple(table), prefix.num_tokens, len(new_blocks), tuple(evicted))

    def grow(
        self,
        request_id: str,
        num_tokens: int,
        block_hashes: Sequence[BlockHash],
        now_s: float = 0.0,
    ) -> bool:
        """Extend a request that holds blocks to `num_tokens` tokens (the output it decoded),
        caching the blocks that are now full with `block_hashes` (its whole sequence's, as in
        `CacheRequest.block_hashes`); vLLM's `allocate_slots` for a running request: no
        lookup. For a caller that learns a request's output only as it is produced (the vLLM
        plugin's shadow caches). Returns False, changing nothing, when the pool cannot give
        the blocks; a request is never shrunk.
        """
        held = self._require(request_id)
        table = held.block_ids
        num_new = -(-num_tokens // self.block_size) - len(table)
        evictor = self.evictor
        if num_new > len(evictor):
            return False
        new_blocks = evictor.pop_n(num_new, now_s) if num_new > 0 else []
        ref = self._ref_count
        block_hash = self._block_hash
        evicted = 0
        for b in new_blocks:
            if block_hash[b] is not None:
                self._uncache(b)
                evicted += 1
            ref[b] = 1
        table.extend(new_blocks)
        hashes = held.hashes
        cached = self._cached
        for i in range(len(hashes), min(num_tokens // self.block_size, len(block_hashes))):
            b = table[i]
            h = block_hashes[i]
            block_hash[b] = h
            self._parent_hash[b] = block_hashes[i - 1] if i else None
            entry = cached.get(h)
            if entry is None:
                cached[h] = b
            elif isinstance(entry, int):
                cached[h] = {entry: None, b: None}
            else:
                entry[b] = None
            hashes.append(h)
        self._version += 1
        self.counters.allocated_blocks += len(new_blocks)
        self.counters.evictions += evicted
        return True

    def free(
        self,
        request_id: str,
        now_s: float = 0.0,
        probability: float | None = None,
        category: str | None = None,
        return_curve: ReturnCurveLike | None = None,
    ) -> None:
        """Release the request's blocks, tail first, with its continuation probability, its
        workload category (for policies that keep one queue per category) and, for evictors
        that ask when it comes back, its conversation's return curve.

        Blocks whose reference count reaches 0 go to the evictor: unhashed ones to the front,
        cached ones with their depth and the release metadata. Cached blocks other requests
        still hold are reported too, so a pooling policy can remember this conversation.
        """
        check_probability(probability)
        held = self._require(request_id)
        del self._held[request_id]
        ref = self._ref_count
        block_hash = self._block_hash
        uncached: list[int] = []
        freed_ids: list[int] = []
        freed_depths: list[int] = []
        freed_hashes: list[BlockHash | None] = []
        shared_ids: list[int] = []
        shared_depths: list[int] = []
        shared_hashes: list[BlockHash | None] = []
        table = held.block_ids
        # bound appends: the loop runs once per block of the request
        add_id, add_depth, add_hash = freed_ids.append, freed_depths.append, freed_hashes.append
        for depth, b in zip(range(len(table) - 1, -1, -1), reversed(table), strict=True):
            refs = ref[b] - 1
            ref[b] = refs
            h = block_hash[b]
            if refs == 0:
                if h is None:
                    uncached.append(b)
                else:
                    add_id(b)
                    add_depth(depth)
                    add_hash(h)
            elif h is not None:
                shared_ids.append(b)
                shared_depths.append(depth)
                shared_hashes.append(h)
        release = Release(
            now_s, probability, held.conversation_id, category=category, return_curve=return_curve
        )
        self.evictor.push_uncached(uncached)
        if freed_ids:
            # The freed cached blocks are the sequence's tail (others hold a prefix): the block
            # before the shallowest is their parent, which a prefix-closed evictor links.
            top = freed_depths[-1]
            self.evictor.push_cached(
                FreedBlocks(
                    freed_ids,
                    freed_depths,
                    freed_hashes,
                    parent_id=table[top - 1] if top else None,
                    chain=True,
                ),
                release,
            )
        if shared_ids:
            self.evictor.note_shared_release(
                FreedBlocks(shared_ids, shared_depths, shared_hashes), release
            )
        self._version += 1
        self.counters.freed_requests += 1

    # -- internals ----------------------------------------------------------------------
    def _require(self, request_id: str) -> _Held:
        held = self._held.get(request_id)
        if held is None:
            raise UnknownRequestError(
                f"request {request_id!r} holds no blocks (never allocated, or already freed)"
            )
        return held

    def _uncache(self, block_id: int) -> None:
        h = self._block_hash[block_id]
        self._block_hash[block_id] = None
        entry = self._cached.get(h)
        if entry is None:
            return
        if isinstance(entry, int):
            if entry == block_id:
                del self._cached[h]
            return
        entry.pop(block_id, None)
        if not entry:
            del self._cached[h]

    def check_invariants(self) -> None:
        """Assert the manager's internal consistency (for tests; O(num_blocks))."""
        free = set(self.evictor.free_block_ids())
        assert len(free) == len(self.evictor), "evictor size is out of sync with its blocks"
        assert NULL_BLOCK_ID not in free, "the null block must never be free"
        holders: dict[int, int] = {}
        for held in self._held.values():
            for b in held.block_ids:
                holders[b] = holders.get(b, 0) + 1
        for b in range(1, self.num_blocks):
            refs = self._ref_count[b]
            assert refs >= 0, f"block {b} has a negative reference count {refs}"
            assert refs == holders.get(b, 0), f"block {b}: ref {refs} != holders {holders.get(b)}"
            assert (refs == 0) == (b in free), f"block {b}: in use and free disagree (ref {refs})"
        for h, blocks in self.cached_hashes().items():
            for b in blocks:
                assert self._block_hash[b] == h, f"block {b} is cached under a hash it lacks"
        num_mapped = sum(len(v) for v in self.cached_hashes().values())
        assert num_mapped == self.num_cached_blocks, "hash map and block hashes disagree"
        if self.evictor.prefix_closed:
            # No orphan: a cached block whose parent content is gone can never be hit again.
            for b in range(1, self.num_blocks):
                parent = self._parent_hash[b]
                if self._block_hash[b] is not None and parent is not None:
                    assert parent in self._cached, (
                        f"{self.evictor.name}: block {b} is cached but its parent is evicted"
                    )
