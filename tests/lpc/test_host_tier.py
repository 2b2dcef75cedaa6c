"""The CPU tier's semantics (vLLM 0.33's OffloadingConnector with an evictor of eviction/):
write-through stores, lookups that continue the GPU prefix, the store threshold, eviction
of unprotected chunks only, and the finish that hands the request's probability on."""

from __future__ import annotations

import pytest

from eviction import POLICIES, FutureUses, make_evictor
from lpc.replay.host_tier import HostTier
from tests.eviction.policy_marks import policy_params


def keys(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def tier(num_chunks: int, policy: str = "lru", threshold: int = 0, **options) -> HostTier:
    return HostTier(num_chunks, make_evictor(policy, num_chunks + 1, **options), threshold)


def test_lookup_counts_consecutive_chunks_from_the_gpu_hit_on() -> None:
    host = tier(8)
    a = keys("a", 5)
    host.offer("r1", a, 0.0)
    assert host.lookup(a, 0, 5) == 5
    assert host.lookup(a, 2, 5) == 3  # continues a GPU hit of 2 blocks
    assert host.lookup(a, 2, 4) == 2  # never past the lookup's end
    holey = [*a[:2], b"missing", *a[3:]]
    assert host.lookup(holey, 0, 5) == 2  # stops at the first miss, as vLLM does


def test_stores_are_write_through_and_skip_resident_chunks() -> None:
    host = tier(8)
    a = keys("a", 3)
    assert host.offer("r1", a, 0.0) == 3
    assert host.offer("r2", [*a, b"a3"], 1.0) == 1  # only the new chunk is stored
    assert host.counters.stored_chunks == 4 and len(host) == 4 and set(host) == {*a, b"a3"}
    host.check_invariants()


def test_lru_evicts_the_least_recent_prompt_tail_first() -> None:
    host = tier(4)
    a, b = keys("a", 3), keys("b", 3)
    host.offer("ra", a, 0.0, "ca")
    host.finish("ra", 1.0, None, "ca")
    host.offer("rb", b, 2.0, "cb")  # 1 free slot, 2 evictions: a's tail, then a1
    assert [k in host for k in a] == [True, False, False]
    assert all(k in host for k in b)
    assert host.counters.evictions == 2
    assert host.lookup(a, 0, 3) == 1
    host.check_invariants()


def test_the_offer_protects_its_resident_chunks() -> None:
    host = tier(4)
    a = keys("a", 3)
    host.offer("r1", a, 0.0)
    host.finish("r1", 0.5, None, "c1")
    host.offer("r2", keys("x", 1), 1.0)  # x0 is now the most recent
    host.finish("r2", 1.5, None, "c2")
    # a0..a2 are the least recent, but this offer holds them: x0 must go instead.
    assert host.offer("r3", [*a, b"a3"], 2.0) == 1
    assert all(k in host for k in [*a, b"a3"]) and b"x0" not in host
    host.check_invariants()


def test_a_store_that_cannot_fit_beside_the_protected_chunks_is_dropped() -> None:
    host = tier(3)
    a = keys("a", 2)
    host.offer("r1", a, 0.0)
    assert host.offer("r2", [*a, *keys("n", 2)], 1.0) == 0  # 2 new, 1 slot unprotected
    assert host.counters.failed_stores == 1
    assert all(k in host for k in a) and len(host) == 2
    host.check_invariants()


def test_store_threshold_counts_offers_before_storing() -> None:
    host = tier(8, threshold=2)
    a = keys("a", 3)
    assert host.offer("r1", a, 0.0) == 0
    assert host.counters.skipped_below_threshold == 3 and host.lookup(a, 0, 3) == 0
    assert host.offer("r2", a, 1.0) == 3
    assert host.lookup(a, 0, 3) == 3


def test_threshold_tracker_forgets_its_oldest_keys_when_full() -> None:
    host = HostTier(8, make_evictor("lru", 9), store_threshold=2, max_tracker_size=2)
    host.offer("r1", [b"k0"], 0.0)
    host.offer("r2", [b"k1", b"k2"], 1.0)  # k0 is forgotten to make room
    assert host.offer("r3", [b"k0"], 2.0) == 0  # its count started again at 1
    assert host.offer("r4", [b"k0"], 3.0) == 1


def test_finish_orders_chunks_by_the_request_probability() -> None:
    host = tier(4, "lpc", scale_per_s=1e-2, fallback_probability=0.5)
    unlikely, likely = keys("u", 2), keys("l", 2)
    host.offer("ru", unlikely, 0.0, "cu")
    host.offer("rl", likely, 0.0, "cl")
    host.finish("rl", 1.0, 0.9, "cl")
    host.finish("ru", 1.0, 0.05, "cu")  # released at the same time, far less likely to return
    host.offer("rn", keys("n", 2), 2.0, "cn")
    assert all(k in host for k in likely) and not any(k in host for k in unlikely)
    host.check_invariants()


def test_load_requires_resident_chunks() -> None:
    host = tier(4)
    a = keys("a", 2)
    host.offer("r1", a, 0.0)
    host.load("r2", a, 0, 2, 1.0)
    assert host.counters.loaded_chunks == 2
    with pytest.raises(KeyError, match="depth 2"):
        host.load("r3", [*a, b"gone"], 0, 3, 2.0)


@pytest.mark.parametrize("policy", policy_params(sorted(POLICIES)))
def test_every_policy_keeps_the_tier_consistent(policy: str) -> None:
    options = {"future": FutureUses()} if POLICIES[policy].kind == "upper bound" else {}
    host = tier(6, policy, **options)
    for r in range(12):
        prompt = [*keys("s", 2), *keys(f"c{r % 4}-", 1 + r % 3)]
        host.offer(f"r{r}", prompt, float(r), f"c{r % 4}")
        host.check_invariants()
        if r % 2:
            host.finish(f"r{r - 1}", r + 0.5, 0.3, f"c{(r - 1) % 4}")
            host.check_invariants()
    assert host.counters.stored_chunks >= 6


@pytest.mark.parametrize(
    ("args", "message"),
    [((0,), "num_chunks"), ((4, -1), "store_threshold"), ((4, 2, 0), "max_tracker_size")],
)
def test_bad_sizes_say_which(args: tuple, message: str) -> None:
    num_chunks = args[0]
    with pytest.raises(ValueError, match=message):
        HostTier(num_chunks, make_evictor("lru", max(num_chunks, 1) + 1), *args[1:])
