"""The replay's CPU tier running LPC's vLLM policies themselves (`CachePolicyTier`): the
policies' release rules (a running request's stores are provisional, the chunks it reuses keep
their keys, the finish releases all with its p), where they part from the replay's own
(`HostTierPolicy`), and the manager's own rules (write-through, lookups from the GPU hit on, the store threshold, atomic
failed stores). Checked against vLLM's real manager in tests/vllm/test_two_tier_agreement.py."""

from __future__ import annotations

import random

import pytest

from eviction import make_evictor
from lpc.integrations.cpu_tier_policy import EvictorCachePolicy
from lpc.replay.ab import ReplayConstants
from lpc.replay.cache_policy_tier import CachePolicyTier
from lpc.replay.host_tier import HostTierPolicy
from lpc.replay.policies import parse_policy
from lpc.replay.simulator import prepare
from lpc.replay.two_tier import cpu_policy_class, host_tier
from lpc.replay.vllm_arc_policy import ReplayARCCachePolicy
from lpc.workload import WorkloadConfig, open_loop_requests
from tests.lpc.synthetic import conversations


def keys(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def tier(num_chunks: int, evictor: str = "lpc", threshold: int = 0) -> CachePolicyTier:
    options = {"scale_per_s": 1e-2, "fallback_probability": 0.5}
    return CachePolicyTier.running(EvictorCachePolicy, num_chunks, evictor, options, 16, threshold)


def host(num_chunks: int) -> CachePolicyTier:
    evictor = make_evictor("lpc", num_chunks + 1, scale_per_s=1e-2, fallback_probability=0.5)
    return CachePolicyTier.over_evictor(num_chunks, evictor, 16)


def test_a_running_requests_stores_outlive_finished_ones_until_it_finishes() -> None:
    a, b, new = keys("a", 2), keys("b", 2), keys("n", 2)
    # The policy queues rb's chunks provisionally, after every chunk queued so far (LRU's
    # place): a goes. The replay's own rules release them at once with the fallback p: b goes.
    policy_tier, stand_in = tier(4), host(4)
    for cpu in (policy_tier, stand_in):
        cpu.offer("ra", a, 0.0, "ca")
        cpu.finish("ra", 1.0, 0.99, "ca")
        cpu.offer("rb", b, 2.0, "cb")
        cpu.offer("rn", new, 3.0, "cn")  # two evictions while rb runs
        cpu.check_invariants()
    assert all(k in policy_tier for k in b) and not any(k in policy_tier for k in a)
    assert all(k in stand_in for k in a) and not any(k in stand_in for k in b)


def test_the_finish_orders_chunks_by_the_request_probability() -> None:
    cpu = tier(4)
    unlikely, likely = keys("u", 2), keys("l", 2)
    cpu.offer("ru", unlikely, 0.0, "cu")
    cpu.offer("rl", likely, 0.0, "cl")
    cpu.finish("rl", 1.0, 0.9, "cl")
    cpu.finish("ru", 1.0, 0.05, "cu")  # released at the same time, far less likely to return
    cpu.offer("rn", keys("n", 2), 2.0, "cn")
    assert all(k in cpu for k in likely) and not any(k in cpu for k in unlikely)
    cpu.check_invariants()


def test_a_running_request_holds_the_chunks_it_reads_until_it_finishes() -> None:
    cpu = tier(5)
    a = keys("a", 3)
    cpu.offer("r1", a, 0.0, "c1")
    cpu.finish("r1", 1.0, 0.05, "c1")  # a: unlikely to come back
    cpu.offer("r2", [b"x0"], 2.0, "c2")
    cpu.finish("r2", 2.0, 0.9, "c2")
    cpu.load("r3", [*a, b"a3"], 0, 3, 3.0, "c1")  # r3 reads a from the CPU tier and runs on
    assert cpu.offer("r3", [*a, b"a3"], 3.0, "c1") == 1
    cpu.offer("r4", keys("n", 1), 4.0, "c4")  # one eviction while r3 runs
    # x0 goes, though likelier than r1's a: r3 holds a (and its own a3) until it finishes, as
    # vLLM's lru ranks a running request's chunks; the head of its prompt does not go first.
    assert all(k in cpu for k in [*a, b"a3"]) and b"x0" not in cpu
    cpu.finish("r3", 5.0, 0.05, "c1")
    cpu.offer("r5", keys("m", 2), 6.0, "c5")  # now r3's unlikely chain goes, tail first
    assert [k in cpu for k in [*a, b"a3"]] == [True, True, False, False]
    cpu.check_invariants()


def test_a_held_chunk_pools_its_final_release_with_what_it_held_before() -> None:
    cpu = tier(4)
    cpu.offer("r1", [b"s0"], 0.0, "c1")
    cpu.finish("r1", 1.0, 0.9, "c1")  # a prefix conversation c1 will likely reuse
    before = cpu.policy.evictor.pooled_key(cpu.policy._chunks[b"s0"].slot)
    cpu.load("r2", [b"s0", b"y0"], 0, 1, 2.0, "c2")  # another conversation reads it
    cpu.offer("r2", [b"s0", b"y0"], 2.0, "c2")
    cpu.finish("r2", 3.0, 0.05, "c2")
    # Max pooling over c1's and c2's releases, not c2's alone (nor the hold's).
    assert cpu.policy.evictor.pooled_key(cpu.policy._chunks[b"s0"].slot) == before
    cpu.check_invariants()


def test_lookup_continues_the_gpu_hit_and_stops_at_the_first_miss() -> None:
    cpu = tier(8)
    a = keys("a", 5)
    assert cpu.offer("r1", a, 0.0) == 5
    assert cpu.lookup(a, 0, 5) == 5 and cpu.lookup(a, 2, 5) == 3 and cpu.lookup(a, 2, 4) == 2
    assert cpu.lookup([*a[:2], b"missing", *a[3:]], 0, 5) == 2
    assert cpu.offer("r2", [*a, b"a5"], 1.0) == 1  # write-through: only the new chunk
    assert cpu.counters.stored_chunks == 6 and len(cpu) == 6 and set(cpu) == {*a, b"a5"}
    cpu.check_invariants()


def test_a_store_that_cannot_fit_beside_the_protected_chunks_is_dropped() -> None:
    cpu = tier(3)
    a = keys("a", 2)
    cpu.offer("r1", a, 0.0)
    assert cpu.offer("r2", [*a, *keys("n", 2)], 1.0) == 0  # 2 new, 1 slot unprotected
    assert cpu.counters.failed_stores == 1 and cpu.counters.evictions == 0
    assert all(k in cpu for k in a) and len(cpu) == 2
    cpu.check_invariants()


def test_the_store_threshold_counts_offers_before_storing() -> None:
    cpu = tier(8, threshold=2)
    a = keys("a", 3)
    assert cpu.offer("r1", a, 0.0) == 0
    assert cpu.counters.skipped_below_threshold == 3 and cpu.lookup(a, 0, 3) == 0
    assert cpu.offer("r2", a, 1.0) == 3 and cpu.lookup(a, 0, 3) == 3


def test_a_load_requires_resident_chunks() -> None:
    cpu = tier(4)
    a = keys("a", 2)
    cpu.offer("r1", a, 0.0)
    cpu.load("r2", a, 0, 2, 1.0)
    assert cpu.counters.loaded_chunks == 2
    with pytest.raises(KeyError, match="depth 2"):
        cpu.load("r3", [*a, b"gone"], 0, 3, 2.0)


@pytest.mark.parametrize("evictor", ["lpc", "lpc-pooled"])
def test_a_random_stream_keeps_the_tier_consistent(evictor: str) -> None:
    rng = random.Random(3)
    cpu = tier(12, evictor, threshold=rng.choice([0, 2]))
    running: list[str] = []
    for r in range(200):
        prompt = [*keys("s", 2), *keys(f"c{r % 5}-", rng.randint(0, 6))]
        hit = cpu.lookup(prompt, 1, len(prompt))
        cpu.load(f"r{r}", prompt, 1, hit, float(r), f"c{r % 5}")
        cpu.offer(f"r{r}", prompt, float(r), f"c{r % 5}")
        running.append(f"r{r}")
        cpu.check_invariants()
        while running and rng.random() < 0.5:
            rid = running.pop(rng.randrange(len(running)))
            cpu.finish(rid, r + 0.5, rng.choice([None, rng.random()]), f"c{rid[1:]}")
            cpu.check_invariants()
    assert cpu.counters.evictions > 0 and cpu.counters.loaded_chunks > 0


def test_a_fault_in_the_policy_stops_the_replay() -> None:
    cpu = tier(2)
    cpu.offer("r1", keys("a", 2), 0.0)

    def broken(n: int, now_s: float = 0.0) -> list[int]:
        raise ZeroDivisionError("evictor bug")

    cpu.policy.evictor.pop_n = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="evict"):
        cpu.offer("r2", keys("b", 1), 1.0)


def test_the_replay_runs_lpc_lpc_pooled_and_vllm_arc_inside_their_vllm_class() -> None:
    convs = conversations(10, seed=2)
    workload = prepare(open_loop_requests(convs, WorkloadConfig(duration_s=60)), 16, {})
    settings = ReplayConstants()
    for name, kind, reads_loads in [
        ("lpc-pooled", EvictorCachePolicy, True),
        ("lpc-const", EvictorCachePolicy, True),
        ("vllm-arc", ReplayARCCachePolicy, True),  # vLLM's ARC (lpc/replay/vllm_arc_policy.py)
        ("lru", HostTierPolicy, False),
        ("arc", HostTierPolicy, False),  # FAST'03 ARC, an evictor
        ("lpc-return-true", HostTierPolicy, False),  # LPCReturnCachePolicy follows its rules
    ]:
        spec = parse_policy(name)
        cpu = host_tier(workload, spec, 1600, settings)
        assert type(cpu.policy) is kind is cpu_policy_class(spec), name
        assert cpu.reads_loads is reads_loads, name
