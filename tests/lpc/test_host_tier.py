"""The CPU tier's semantics with an evictor of eviction/ under the replay's release rules
(`CachePolicyTier` running `HostTierPolicy`): write-through stores, lookups that continue the
GPU prefix, the store threshold, eviction of unprotected chunks only, the finish that hands the
request's probability on; and the policy's own contract (one evictor event per store, loads
that change nothing, pins, atomic failed evictions)."""

from __future__ import annotations

import pytest

from eviction import POLICIES, FutureUses, make_evictor
from lpc.replay.cache_policy_tier import CachePolicyTier, ChunkStatus, RequestContext
from lpc.replay.host_tier import HostTierPolicy
from tests.eviction.policy_marks import policy_params


def keys(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def tier(num_chunks: int, policy: str = "lru", threshold: int = 0, **options) -> CachePolicyTier:
    evictor = make_evictor(policy, num_chunks + 1, **options)
    return CachePolicyTier.over_evictor(num_chunks, evictor, 16, threshold)


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
    host = CachePolicyTier.over_evictor(
        8, make_evictor("lru", 9), 16, store_threshold=2, max_tracker_size=2
    )
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
        CachePolicyTier.over_evictor(
            num_chunks, make_evictor("lru", max(num_chunks, 1) + 1), 16, *args[1:]
        )


class CallLog:
    """An evictor that records the calls the policy makes to it (name and arguments)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        attribute = getattr(self.inner, name)
        if name not in {"reset", "push_cached", "push_uncached", "remove", "pop_n"}:
            return attribute

        def call(*args):
            result = attribute(*args)
            shown = [list(a) if name == "reset" else a for a in args]
            if name == "push_cached":
                freed, release = args
                shown = [list(freed.block_ids), list(freed.depths), release.probability]
            self.calls.append((name, *shown, result))
            return result

        return call

    def __len__(self) -> int:
        return len(self.inner)


def logged_tier(num_chunks: int, threshold: int = 0) -> tuple[CachePolicyTier, CallLog]:
    log = CallLog(make_evictor("lru", num_chunks + 1))
    return CachePolicyTier.over_evictor(num_chunks, log, 16, threshold), log  # type: ignore[arg-type]


def test_one_store_is_one_evictor_event_in_the_replays_order() -> None:
    host, log = logged_tier(6)
    a = [*keys("a", 3), b"a3", b"a4"]
    host.offer("r1", a[:3], 0.0, "c1")
    host.finish("r1", 1.0, 0.5, "c1")
    log.calls.clear()
    assert host.lookup(a, 1, 4) == 2  # continues a GPU hit of 1 block
    host.load("r2", a, 1, 2, 2.0, "c2")
    assert host.offer("r2", a, 2.0, "c2") == 2
    assert log.calls == []  # neither the load nor the store has made a call yet
    host.finish("r2", 3.0, 0.25, "c2")  # r2's store is over: its event, then the finish's
    assert log.calls[:3] == [("remove", 1, None), ("remove", 2, None), ("remove", 3, None)]
    name, n, now, slots = log.calls[3]  # the resident chunks left prefix first, then one pop
    assert (name, n, now) == ("pop_n", 2, 2.0)
    order = [*slots[::-1], 3, 2, 1]  # tail first
    assert log.calls[4] == ("push_cached", order, [4, 3, 2, 1, 0], None, None)  # no p yet
    assert log.calls[5:] == [
        *[("remove", slot, None) for slot in order],
        ("push_cached", order, [4, 3, 2, 1, 0], 0.25, None),
    ]
    host.check_invariants()


def test_a_store_that_evicts_pops_the_free_slots_with_the_evicted_ones() -> None:
    host, log = logged_tier(3)
    host.offer("r1", keys("a", 2), 0.0, "c1")
    host.finish("r1", 1.0, None, "c1")
    log.calls.clear()
    assert host.offer("r2", keys("b", 2), 2.0, "c2") == 2  # 1 free slot, 1 eviction
    ((name, n, now, slots),) = log.calls  # one pop for both, at the store's time
    assert (name, n, now) == ("pop_n", 2, 2.0) and host.counters.evictions == 1
    host.finish("r2", 3.0, 0.9, "c2")  # the store's push, then the finish's
    pushes = [call for call in log.calls if call[0] == "push_cached"]
    assert [push[3] for push in pushes] == [None, 0.9]
    assert pushes[0][1] == slots[::-1]  # tail first: the second chunk got the second slot
    assert pushes[0][2] == [1, 0]
    host.check_invariants()


def test_a_load_changes_nothing_the_evictor_sees() -> None:
    # What lets one pass serve GPU replays with different hits (two_tier_grid).
    logs = []
    for loads in (True, False):
        host, log = logged_tier(5)
        for r in range(30):
            prompt = [*keys("s", 2), *keys(f"c{r % 3}-", 1 + r % 4)]
            hit = host.lookup(prompt, 1, len(prompt) - 1)
            if loads:
                host.load(f"r{r}", prompt, 1, hit, float(r), f"c{r % 3}")
            host.offer(f"r{r}", prompt, float(r), f"c{r % 3}")
            if r % 2:
                host.finish(f"r{r - 1}", r + 0.5, 0.1 * (r % 10), f"c{(r - 1) % 3}")
            host.check_invariants()
        logs.append(log.calls)
    assert logs[0] == logs[1] and len(logs[0]) > 60
    assert not HostTierPolicy.reads_loads and not tier(4).reads_loads


def policy(num_chunks: int) -> HostTierPolicy:
    return HostTierPolicy(num_chunks, make_evictor("lru", num_chunks + 1), 16)


def context(rid: str, keys_: list[bytes]) -> RequestContext:
    ctx = RequestContext(rid)
    ctx.positions.update({key: 16 * (i + 1) for i, key in enumerate(keys_)})
    return ctx


def store(cpu: HostTierPolicy, rid: str, keys_: list[bytes]) -> list[ChunkStatus]:
    ctx = context(rid, keys_)
    chunks = []
    for key in keys_:
        chunk = ChunkStatus()
        cpu.insert(key, chunk, ctx)
        chunk.ref_cnt = 0
        cpu.mark_evictable(key)
        chunks.append(chunk)
    return chunks


def test_a_pinned_chunk_is_never_evicted() -> None:
    cpu = policy(3)
    a = keys("a", 3)
    store(cpu, "r1", a)
    cpu.on_request_finished(((*a,),), set(a), set(), context("r1", a))  # a2 goes first
    cpu.mark_non_evictable(b"a2")  # a load reads it
    evicted = cpu.evict(2, set())
    assert evicted is not None and [key for key, _ in evicted] == [b"a1", b"a0"]
    assert cpu.get(b"a2") is not None
    assert cpu.evict(2, set()) is None  # only the pinned chunk is left
    cpu.check_invariants()
    cpu.mark_evictable(b"a2")
    assert [key for key, _ in cpu.evict(1, set()) or []] == [b"a2"]
    cpu.check_invariants()


def test_a_failed_eviction_changes_nothing() -> None:
    cpu = policy(3)
    a = keys("a", 3)
    store(cpu, "r1", a)
    assert cpu.evict(2, {b"a0", b"a1"}) is None
    assert set(cpu) == set(a) and cpu.evict(1, {b"a0", b"a1"}) == [(b"a2", cpu_status(a))]
    cpu.check_invariants()


def cpu_status(keys_: list[bytes]) -> ChunkStatus:
    """Any status compares equal here (vLLM's is a ctypes struct; the replay's a dataclass)."""
    return ChunkStatus(0)


def test_a_chunk_in_flight_waits_for_its_store_to_complete() -> None:
    cpu = policy(2)
    ctx = context("r1", [b"k"])
    chunk = ChunkStatus()
    cpu.insert(b"k", chunk, ctx)  # its store is in flight (ref_cnt -1)
    store(cpu, "r2", [b"m"])  # r1's store is over, but k is not evictable yet
    assert cpu.evict(1, set()) is not None and cpu.get(b"k") is not None
    cpu.check_invariants()
    chunk.ref_cnt = 0
    cpu.mark_evictable(b"k")  # now it enters the evictor, with r1's store release
    assert [key for key, _ in cpu.evict(1, set()) or []] == [b"k"]
    cpu.check_invariants()


def test_remove_and_clear_free_the_slots() -> None:
    cpu = policy(3)
    store(cpu, "r1", keys("a", 3))
    cpu.remove(b"a1")
    assert len(cpu) == 2 and cpu.get(b"a1") is None
    cpu.check_invariants()
    store(cpu, "r2", [b"b0"])
    assert len(cpu) == 3
    cpu.clear()
    assert len(cpu) == 0 and list(cpu) == []
    cpu.check_invariants()


def test_touch_releases_the_keys_as_most_recent() -> None:
    cpu = policy(3)
    a = keys("a", 3)
    store(cpu, "r1", a)
    cpu.touch([b"a2"], context("r2", a))  # the tail goes last now
    assert [key for key, _ in cpu.evict(3, set()) or []] == [b"a1", b"a0", b"a2"]
