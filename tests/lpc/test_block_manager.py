"""Block manager invariants under random streams, hit semantics, salts and bad input."""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eviction import POLICIES, FutureUses, make_evictor
from lpc.blocks.block_manager import (
    CacheRequest,
    PrefixCacheBlockManager,
    UnknownRequestError,
)
from lpc.blocks.hashing import BlockHasher
from tests.eviction.policy_marks import LEARNED_CACHE_EXAMPLES, learned_caches, other_policies
from tests.lpc.streams import Allocate, random_stream
from tests.properties import check_due


def manager_with(policy: str, num_blocks: int = 40, block_size: int = 4) -> PrefixCacheBlockManager:
    options = {"future": FutureUses()} if POLICIES[policy].kind == "upper bound" else {}
    return PrefixCacheBlockManager(
        num_blocks, block_size, evictor=make_evictor(policy, num_blocks, **options)
    )


def snapshot(manager: PrefixCacheBlockManager) -> tuple:
    return (
        manager.evictor.free_block_ids(),
        manager.cached_hashes(),
        {rid: manager.blocks_of(rid) for rid in manager.active_request_ids()},
        copy.copy(manager.counters),
        [manager.ref_count(b) for b in range(manager.num_blocks)],
    )


@pytest.mark.parametrize("policy", other_policies(POLICIES))
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_invariants_hold_along_random_streams(policy: str, seed: int) -> None:
    check_invariants_on_a_stream(policy, seed)


@pytest.mark.slow
@pytest.mark.parametrize("policy", learned_caches(POLICIES))
@settings(max_examples=LEARNED_CACHE_EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_invariants_hold_along_random_streams_with_a_learned_cache(policy: str, seed: int) -> None:
    check_invariants_on_a_stream(policy, seed)


def check_invariants_on_a_stream(policy: str, seed: int) -> None:
    """A random stream of allocations and frees; the hits and salts checked at each step, the
    manager's and evictor's invariants every `CHECK_EVERY` steps and at the end."""
    manager = manager_with(policy)
    creator_salt: dict[bytes, str | None] = {}
    for index, step in enumerate(random_stream(seed, 150)):
        if isinstance(step, Allocate):
            request = step.request
            prefix = manager.find_computed_prefix(request)
            hashes = prefix.block_hashes
            k = len(prefix.block_ids)
            # A hit is a contiguous prefix of the prompt's own chain, and the longest one.
            assert [manager.block_hash(b) for b in prefix.block_ids] == list(hashes[:k])
            max_blocks = (request.num_prompt_tokens - 1) // manager.block_size
            assert k == max_blocks or manager.cached_block(hashes[k]) is None
            allocation = manager.allocate(request, prefix, step.now_s)
            if allocation is not None:
                for h in hashes[:k]:
                    assert creator_salt[h] == request.cache_salt, "a salted request crossed salts"
                for h in hashes:
                    creator_salt.setdefault(h, request.cache_salt)
        elif step.request_id in manager.active_request_ids():
            manager.free(step.request_id, step.now_s, step.probability)
        if check_due(index):
            manager.check_invariants()
            manager.evictor.check_invariants()
    manager.check_invariants()
    manager.evictor.check_invariants()
    assert manager.counters.hit_tokens <= manager.counters.queried_tokens


def test_salts_isolate_identical_prompts() -> None:
    manager = PrefixCacheBlockManager(32, 4)
    tokens = list(range(20))
    first = CacheRequest("a", tokens, 20, cache_salt="tenant-a")
    manager.allocate(first, None, 0.0)
    manager.free("a", 1.0)
    other = manager.find_computed_prefix(CacheRequest("b", tokens, 20, cache_salt="tenant-b"))
    same = manager.find_computed_prefix(CacheRequest("c", tokens, 20, cache_salt="tenant-a"))
    unsalted = manager.find_computed_prefix(CacheRequest("d", tokens, 20))
    assert other.num_tokens == 0 and unsalted.num_tokens == 0
    assert same.num_tokens == 16  # capped at 19 tokens, whole blocks


def test_lora_and_multimodal_keys_change_hashes() -> None:
    from lpc.blocks.hashing import MultiModalSpan

    hasher = BlockHasher(4)
    tokens = list(range(12))
    plain = hasher.hash_sequence(tokens)
    lora = hasher.hash_sequence(tokens, lora_id="adapter-1")
    image = hasher.hash_sequence(tokens, mm_spans=(MultiModalSpan("img-abc", 5, 2),))
    assert all(a != b for a, b in zip(plain, lora, strict=True))
    assert image[0] == plain[0]  # the image starts in block 1
    assert image[1] != plain[1] and image[2] != plain[2]  # and every later hash chains on it


def test_hashes_are_stable_across_processes_and_releases() -> None:
    code = (
        "from lpc.blocks.hashing import BlockHasher;"
        "print(BlockHasher(4).hash_sequence(list(range(8)), cache_salt='s')[1].hex())"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": "."},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    local = BlockHasher(4).hash_sequence(list(range(8)), cache_salt="s")[1].hex()
    assert outputs == {local}
    # Pinned: a change of encoding would silently invalidate every recorded trace.
    assert local == GOLDEN_SHA256_SALTED_BLOCK1


def test_xxh3_is_a_different_but_deterministic_chain() -> None:
    a = BlockHasher(4, "xxh3_128").hash_sequence(list(range(8)))
    b = BlockHasher(4, "xxh3_128").hash_sequence(list(range(8)))
    assert a == b and len(a[0]) == 16
    assert a != BlockHasher(4).hash_sequence(list(range(8)))


def test_only_full_blocks_are_cached_and_the_last_prompt_token_is_recomputed() -> None:
    manager = PrefixCacheBlockManager(16, 4)
    request = CacheRequest("a", list(range(10)), 8)  # 2 full blocks + 2 tokens
    allocation = manager.allocate(request, None, 0.0)
    assert allocation is not None and len(allocation.block_ids) == 3
    assert manager.num_cached_blocks == 2
    manager.free("a", 1.0)
    again = manager.find_computed_prefix(CacheRequest("b", list(range(8)), 8))
    assert again.num_tokens == 4  # 8 prompt tokens: at most 7 can hit, so one block


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_blocks": 0}, "num_blocks"),
        ({"num_blocks": -3}, "num_blocks"),
        ({"num_blocks": 1}, "null block"),
        ({"num_blocks": 8, "block_size": 0}, "block_size"),
        ({"num_blocks": 8, "block_size": -16}, "block_size"),
        ({"num_blocks": 8, "max_model_len": 0}, "max_model_len"),
        ({"num_blocks": 8, "hash_algorithm": "md5"}, "unknown hash algorithm 'md5'"),
    ],
)
def test_bad_sizes_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrefixCacheBlockManager(**kwargs)


@pytest.fixture
def busy_manager() -> PrefixCacheBlockManager:
    manager = PrefixCacheBlockManager(10, 4)
    manager.allocate(CacheRequest("a", list(range(10)), 8), None, 0.0)
    manager.allocate(CacheRequest("b", list(range(6)), 6), None, 0.0)
    manager.free("b", 1.0, 0.5)
    return manager


def test_freeing_an_unknown_request_changes_nothing(busy_manager) -> None:
    before = snapshot(busy_manager)
    with pytest.raises(UnknownRequestError, match="'nope' holds no blocks"):
        busy_manager.free("nope", 2.0)
    with pytest.raises(UnknownRequestError, match="'b' holds no blocks"):
        busy_manager.free("b", 2.0)  # already freed
    assert snapshot(busy_manager) == before


@pytest.mark.parametrize("probability", [-0.1, 1.01, math.nan, math.inf, "0.5", True])
def test_bad_probabilities_are_rejected_before_anything_changes(busy_manager, probability) -> None:
    before = snapshot(busy_manager)
    with pytest.raises(ValueError, match="probability"):
        busy_manager.free("a", 2.0, probability)
    assert snapshot(busy_manager) == before
    busy_manager.free("a", 2.0, 0.5)  # the request is still there, intact


def test_allocating_beyond_capacity_is_a_counted_failure(busy_manager) -> None:
    before = snapshot(busy_manager)
    big = CacheRequest("big", list(range(100, 200)), 50)
    assert busy_manager.allocate(big, None, 2.0) is None
    after = snapshot(busy_manager)
    assert after[:3] == before[:3] and after[4] == before[4]
    assert busy_manager.counters.allocation_failures == before[3].allocation_failures + 1


@pytest.mark.parametrize(
    ("tokens", "error", "message"),
    [
        ([1, 2, 3.0, 4], TypeError, r"token_ids\[2\] must be an int, got float 3.0"),
        ([1, "2", 3], TypeError, r"token_ids\[1\] must be an int, got str"),
        ([1, None], TypeError, r"token_ids\[1\] must be an int"),
        ([1, -5, 3], ValueError, r"token_ids\[1\] = -5 is negative"),
        ([1, 2**70], ValueError, r"token_ids\[1\] = .* does not fit in 64 bits"),
    ],
)
def test_bad_tokens_name_the_position(busy_manager, tokens, error, message) -> None:
    before = snapshot(busy_manager)
    request = CacheRequest("bad", tokens, 1)
    with pytest.raises(error, match=message):
        busy_manager.find_computed_prefix(request)
    with pytest.raises(error, match=message):
        busy_manager.allocate(request, None, 2.0)
    assert snapshot(busy_manager) == before


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: CacheRequest("x", [1, 2], 0), "num_prompt_tokens must be in"),
        (lambda: CacheRequest("x", [1, 2], 3), "num_prompt_tokens must be in"),
        (lambda: CacheRequest("", [1, 2], 1), "request_id"),
        (lambda: CacheRequest("x", [], 1), "num_prompt_tokens must be in"),
    ],
)
def test_malformed_requests_are_rejected(build, message) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_duplicate_and_oversized_requests_are_rejected(busy_manager) -> None:
    before = snapshot(busy_manager)
    with pytest.raises(ValueError, match="'a' already holds blocks"):
        busy_manager.allocate(CacheRequest("a", [1, 2], 2), None, 2.0)
    limited = PrefixCacheBlockManager(10, 4, max_model_len=8)
    with pytest.raises(ValueError, match="9 tokens, more than max_model_len 8"):
        limited.allocate(CacheRequest("long", list(range(9)), 9), None, 0.0)
    assert snapshot(busy_manager) == before


GOLDEN_SHA256_SALTED_BLOCK1 = "bd10db113872ec856d95c7c9513caa35a6bb124d433919774efa935da2d0c5a4"


def test_growing_a_request_caches_its_output_as_one_allocation_would() -> None:
    """A request allocated with its prompt, then grown to prompt + output, ends with the same
    cached blocks and hits for the next turn as one allocated whole (the shadow caches grow
    requests as vLLM decodes them)."""
    tokens = list(range(100, 118))  # 18 tokens: 4 full blocks of 4 and a partial one
    hashes = BlockHasher(4).hash_sequence(tokens)
    whole, grown = manager_with("lru"), manager_with("lru")
    whole.allocate(CacheRequest("r", tokens, 9, block_hashes=hashes))
    assert grown.allocate(CacheRequest("r", tokens[:9], 9, block_hashes=hashes[:2]))
    assert grown.num_cached_blocks == 2
    assert grown.grow("r", 9, hashes)  # nothing new to cache yet: the third block is partial
    assert grown.num_cached_blocks == 2 and len(grown.blocks_of("r")) == 3
    assert grown.grow("r", 17, hashes, now_s=1.0)
    assert len(grown.blocks_of("r")) == len(whole.blocks_of("r")) == 5
    assert grown.num_cached_blocks == whole.num_cached_blocks == 4
    for manager in (whole, grown):
        manager.free("r", 2.0)
        manager.check_invariants()
        follow_up = CacheRequest("next", [*tokens, 7, 8], 20)
        assert manager.find_computed_prefix(follow_up).num_tokens == 16


def test_growing_beyond_the_pool_changes_nothing() -> None:
    manager = manager_with("lru", num_blocks=5)  # 4 usable blocks
    tokens = list(range(40))
    hashes = BlockHasher(4).hash_sequence(tokens)
    manager.allocate(CacheRequest("r", tokens[:8], 8, block_hashes=hashes[:2]))
    before = snapshot(manager)
    assert not manager.grow("r", 40, hashes)
    assert snapshot(manager) == before
    with pytest.raises(UnknownRequestError):
        manager.grow("unknown", 8, hashes)
