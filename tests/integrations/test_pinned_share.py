"""One tenant's pinned share of the pool (`pinned_share`), without vLLM.

A tenant's pinned blocks are the free blocks the learned evictor holds that its releases put
above LRU's place with a trusted hint (a `TenantRelease` that is `hinted`, p above the
fallback p). Once a second tenant has released into the queue, a release that would take them
past `pinned_share` × the pool's blocks is keyed at the fallback p. Here: the cap binds against
a tenant sending p = 1.0, and only in a shared pool; the counts equal a brute-force count under
random vLLM calls, mode switches and a failing evictor; the setting is validated like the
others.
The pin attack on real vLLM, capped: test_trust.py.
"""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from eviction import Release
from lpc.integrations import vllm_queue
from lpc.integrations.config import PluginConfig, PluginConfigError, load_config
from lpc.integrations.engine_config import config_from_table
from lpc.integrations.kill_switch import ModeSwitch
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_plugin import PluginRuntime
from lpc.integrations.vllm_queue import (
    LPCFreeBlockQueue,
    ProtectedRelease,
    QueueRuntime,
    TenantRelease,
    bind_queue_class,
)
from tests.integrations.pool_blocks import Block, Pool, allocate


def make_queue(num_blocks: int, **config: Any) -> tuple[Any, list[Block], QueueRuntime]:
    config.setdefault("evictor", "lpc")
    runtime = QueueRuntime(
        PluginConfig(**config), PluginStats(), lambda: 0.0, mode=ModeSwitch("lpc")
    )
    pool = Pool()
    blocks = [Block(i, pool) for i in range(num_blocks)]
    pool.free_block_queue = bind_queue_class(runtime)(blocks)
    return pool.free_block_queue, blocks, runtime


def release(queue: Any, runtime: QueueRuntime, chain: list[Block], why: Release) -> None:
    """Free `chain` (allocation order) as vLLM does: cached blocks tail first, under `why`."""
    for depth, block in enumerate(chain):
        block.ref_cnt = 0
        block.block_hash = bytes([depth, block.block_id % 256, block.block_id // 256])
        block.block_hash_num_tokens = 16 * (depth + 1)
    with runtime.releasing(why):
        queue.append_n(chain[::-1])


def hint(time_s: float, p: float, tenant: str) -> TenantRelease:
    """A finished release whose p is the tenant's trusted hint."""
    return TenantRelease(time_s, p, f"{tenant}-{time_s:g}", tenant=tenant, hinted=True)


def take(queue: Any, n: int) -> list[Block]:
    blocks = queue.popleft_n(n)
    for block in blocks:
        block.ref_cnt = 1
    return blocks


def test_the_cap_binds_on_a_tenant_sending_p_1() -> None:
    """A 64-block pool at share 0.25: the attacker's p = 1.0 pins 16 blocks (4 chains of 4),
    no more; its later chains are keyed at the fallback p, LRU's place among the victim's."""
    queue, _, runtime = make_queue(64, pinned_share=0.25, fallback_probability=0.5)
    attacker_chains = []
    for step in range(12):
        chain = take(queue, 4)
        if step % 2 == 0:
            attacker_chains.append(chain)
            why = hint(float(step), 1.0, "salt=a")
        else:
            why = TenantRelease(float(step), None, f"v{step}", tenant="salt=v")
        release(queue, runtime, chain, why)
        assert queue.pinned_counts().get("salt=a", 0) <= 16
    assert queue.pinned_counts() == {"salt=a": 16}
    assert runtime.stats.pinned_share_capped == 2  # releases 5 and 6 of the attacker's
    order = [b.block_id for b in queue.get_all_free_blocks()]
    pinned = {b.block_id for chain in attacker_chains[:4] for b in chain}
    assert set(order[-16:]) == pinned, "the pinned chains go last"
    capped = attacker_chains[4][0].block_id  # released at t = 8, after the victim's t = 7
    victim_before, victim_after = 7 * 4 + 1, 9 * 4 + 1  # blocks of releases t = 7, t = 9
    assert order.index(victim_before) < order.index(capped) < order.index(victim_after)
    # Evicting pinned blocks makes room again: the next hint pins.
    queue.popleft_n(len(order) - 8)  # every block but the last two pinned chains
    assert queue.pinned_counts() == {"salt=a": 8}
    release(queue, runtime, take(queue, 4), hint(20.0, 1.0, "salt=a"))
    assert queue.pinned_counts() == {"salt=a": 8} and runtime.stats.pinned_share_capped == 2


def test_tenants_are_capped_apart_and_only_hints_above_the_fallback_pin() -> None:
    queue, _, runtime = make_queue(40, pinned_share=0.25, fallback_probability=0.3)  # cap 10
    for step, why in enumerate(
        [
            hint(0.0, 0.9, "salt=a"),
            hint(1.0, 0.9, "salt=b"),
            hint(2.0, 0.3, "salt=a"),  # at the fallback p: not pinned
            TenantRelease(3.0, 0.99, "m", tenant="salt=a"),  # the model's p: not counted
            Release(3.5, 0.99, "x"),  # no tenant (e.g. the plugin's fallback): not counted
            ProtectedRelease(4.0, None, "a"),  # a preempted request's: not counted
            hint(5.0, 0.9, "salt=a"),
            hint(6.0, 0.9, "salt=a"),  # 12 > 10: capped
        ]
    ):
        release(queue, runtime, take(queue, 4), why)
        assert runtime.stats.pinned_share_capped == (step == 7)
    assert queue.pinned_counts() == {"salt=a": 8, "salt=b": 4}


def test_a_lone_tenant_is_not_capped_until_another_shares_the_pool() -> None:
    """One tenant displaces only its own blocks: every client of a deployment without salts
    or adapters is the tenant "", and a router's p for all of them is not capped. Its pinned
    blocks are counted all the same, and the second tenant's first release makes it bind."""
    queue, _, runtime = make_queue(40, pinned_share=0.25)  # cap 10
    for step in range(5):
        release(queue, runtime, take(queue, 4), hint(float(step), 1.0, ""))
    assert queue.pinned_counts() == {"": 20} and runtime.stats.pinned_share_capped == 0
    release(queue, runtime, take(queue, 4), TenantRelease(5.0, None, "v", tenant="salt=v"))
    release(queue, runtime, take(queue, 4), hint(6.0, 1.0, ""))
    assert queue.pinned_counts() == {"": 20} and runtime.stats.pinned_share_capped == 1


def test_a_capped_release_pools_no_hint_into_its_shared_blocks() -> None:
    queue, _, runtime = make_queue(16, pinned_share=0.25, fallback_probability=0.5)  # cap 4
    release(queue, runtime, take(queue, 2), TenantRelease(0.0, None, "v", tenant="v"))
    release(queue, runtime, take(queue, 4), hint(0.0, 1.0, "t"))
    held = take(queue, 3)  # another request holds these, then shares them
    why = hint(1.0, 1.0, "t")
    release(queue, runtime, take(queue, 2), why)  # 4 + 2 > 4: capped
    queue.note_shared_release(held, why)
    assert runtime.stats.pinned_share_capped == 1
    fallback_key = queue.evictor.key_for(Release(1.0, None, "x"))
    assert [queue.evictor.pooled_key(b.block_id) for b in held] == [fallback_key] * 3


def test_tenants_past_the_table_share_one_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_queue, "MAX_PINNING_TENANTS", 2)
    queue, _, runtime = make_queue(40, pinned_share=0.25)  # cap 10
    for tenant in ("a", "b", "c", "d", "e"):
        release(queue, runtime, take(queue, 4), hint(0.0, 1.0, tenant))
    # c and d share the third count (8 blocks); e would take it to 12: capped.
    assert queue.pinned_counts() == {"a": 4, "b": 4, "*": 8}
    assert runtime.stats.pinned_share_capped == 1


def test_share_one_is_no_cap_and_lpc_return_pins_nothing() -> None:
    queue, _, runtime = make_queue(20, pinned_share=1.0)
    for step in range(5):
        release(queue, runtime, take(queue, 4), hint(float(step), 1.0, "ab"[step % 2]))
    assert queue.pinned_counts() == {"a": 12, "b": 8} and runtime.stats.pinned_share_capped == 0
    queue, _, runtime = make_queue(20, evictor="lpc-return", pinned_share=0.0)
    release(queue, runtime, take(queue, 4), TenantRelease(0.0, None, "v", tenant="v"))
    release(queue, runtime, take(queue, 4), hint(1.0, 1.0, "a"))
    assert queue.pinned_counts() == {} and runtime.stats.pinned_share_capped == 0


class Failing(Exception):
    pass


def break_evictor(queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every method of the learned evictor the queue calls raises from now on."""

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise Failing("injected")

    learned = queue.evictor
    for name in ("pop_n", "remove", "push_cached", "push_protected", "note_shared_release"):
        monkeypatch.setattr(learned, name, fail)


@pytest.mark.parametrize("small_pop", [vllm_queue.SMALL_POP, 0], ids=["loop", "numpy"])
@pytest.mark.parametrize("evictor", ["lpc", "lpc-pooled"])
@pytest.mark.parametrize("seed", range(4))
def test_the_counts_are_the_pinned_blocks_under_random_calls(
    evictor: str, seed: int, small_pop: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A random stream of vLLM's calls (pops, hits, releases with and without hints, shared
    releases, switches off and on) and, in half the seeds, an evictor that starts raising:
    after every call each tenant's count is the brute-force count of the free blocks the
    learned evictor holds whose last release pinned them, and above the cap only if the tenant
    got there alone in the pool. Pops unpin block by block (`SMALL_POP`), or in numpy (0)."""
    monkeypatch.setattr(vllm_queue, "SMALL_POP", small_pop)
    rng = random.Random(seed)
    num_blocks, share, fallback = 48, 0.15, 0.4
    queue, blocks, runtime = make_queue(
        num_blocks, evictor=evictor, pinned_share=share, fallback_probability=fallback
    )
    cap = share * num_blocks
    pinned_by: dict[int, str] = {}  # block id -> tenant its last release pinned it for
    seen: set[str] = set()  # tenants that released into the learned evictor
    over_alone: set[str] = set()  # tenants past the cap while alone in the pool
    break_at = rng.randrange(400, 560) if seed % 2 else None
    in_use: list[Block] = []
    most = 0  # the most blocks one tenant held pinned

    def brute() -> Counter[str]:
        """Free blocks outside vLLM's list (so the learned evictor's) pinned by a tenant."""
        return Counter(
            pinned_by[b.block_id]
            for b in blocks
            if b.ref_cnt == 0 and b.prev_free_block is None and b.block_id in pinned_by
        )

    for step in range(600):
        if step == break_at:
            break_evictor(queue, monkeypatch)
        engine = blocks[0].pool.free_block_queue
        action = rng.random()
        if action < 0.02:  # off for a while now and then; on most of the time
            runtime.mode.set(rng.choice(["lpc", "lpc", "lru", "shadow"]), "test")
        elif action < 0.35 and engine.num_free_blocks:
            n = rng.randint(1, min(6, engine.num_free_blocks))
            in_use.extend(allocate(engine, n, step))
        elif action < 0.5:
            free_cached = [b for b in blocks if b.ref_cnt == 0 and b.block_hash is not None]
            if free_cached:
                block = rng.choice(free_cached)
                engine.remove(block)
                block.ref_cnt = 1
                in_use.append(block)
        elif in_use:
            k = min(len(in_use), rng.randint(1, 5))
            chain = [in_use.pop(rng.randrange(len(in_use))) for _ in range(k)]
            tenant = rng.choice(["salt=a", "salt=b", "", "lora=x"])
            p = rng.choice([1.0, 0.9, fallback, 0.1, None])
            kind = rng.random()
            if kind < 0.6:
                why: Release = TenantRelease(
                    float(step), p, f"c{step}", tenant=tenant, hinted=p is not None
                )
            elif kind < 0.7:
                why = ProtectedRelease(float(step), None, f"c{step}")
            elif kind < 0.85:  # the model's p, or none
                why = TenantRelease(float(step), p, f"c{step}", tenant=tenant)
            else:
                why = Release(float(step), p, f"c{step}")
            cached = [b for b in chain if rng.random() < 0.85]
            for block in chain:
                block.ref_cnt = 0
                pinned_by.pop(block.block_id, None)
            for depth, block in enumerate(cached):
                block.block_hash = bytes([seed, step % 256, depth, block.block_id])
                block.block_hash_num_tokens = 16 * (depth + 1)
            for block in chain:
                if block not in cached:
                    block.block_hash = block.block_hash_num_tokens = None
            # The pool's queue read at every call, as vLLM's BlockPool does: a list switched
            # on rejoins the LPC queue at this first call, so the append goes there.
            pool = blocks[0].pool
            pool.free_block_queue.prepend_n([b for b in chain[::-1] if b.block_hash is None])
            engine = pool.free_block_queue
            # The rule, brute force: the queue takes the release (LPC's phase, the pool holds
            # it, the evictor answers), a hint above the fallback p, and the tenant alone in
            # the pool so far or its count after it within the cap.
            learned = (
                isinstance(engine, LPCFreeBlockQueue)
                and engine.phase == "lpc"
                and not engine._tripped
            )
            if learned and cached and type(why) is TenantRelease:
                seen.add(tenant)
            takes = learned and (break_at is None or step < break_at)
            hinted = type(why) is TenantRelease and why.hinted
            pins = hinted and p is not None and p > fallback and takes
            if pins and cached and (len(seen) < 2 or brute()[tenant] + len(cached) <= cap):
                for block in cached:
                    pinned_by[block.block_id] = tenant
            with runtime.releasing(why):
                engine.append_n([b for b in chain[::-1] if b.block_hash is not None])
                if isinstance(engine, LPCFreeBlockQueue):
                    shared = [b for b in in_use if b.block_hash is not None][:2]
                    engine.note_shared_release(shared, why)
        counts = queue.pinned_counts()
        assert counts == {t: c for t, c in brute().items() if c}, f"step {step}"
        over = {t for t, c in counts.items() if c > cap}
        if len(seen) < 2:
            over_alone |= over
        assert over <= over_alone, f"step {step}: past the cap in a shared pool"
        assert queue._pinned_total == sum(counts.values())
        most = max(most, *counts.values(), 0)
        if not len(queue.evictor) or queue._tripped:
            assert counts == {}, f"step {step}: the evictor is empty, and so are the counts"
    assert most > cap / 2 and runtime.stats.pinned_share_capped > 0, "the cap never bound"
    assert break_at is None or queue._tripped, "the failing evictor tripped the queue"


# -- the plugin: which releases carry a tenant ----------------------------------------------
def finished_request(extra_args: dict[str, Any], salt: str | None) -> SimpleNamespace:
    return SimpleNamespace(
        request_id="r1",
        sampling_params=SimpleNamespace(extra_args=extra_args),
        cache_salt=salt,
        lora_request=None,
        session_id=None,
        kv_hints=None,
        is_finished=lambda: True,
    )


@pytest.mark.parametrize("trusted", [True, False])
def test_the_plugin_gives_a_trusted_hint_its_tenant(trusted: bool) -> None:
    config = PluginConfig(stats_log_interval_s=0.0, trust_request_hints=trusted)
    stats = PluginStats()
    runtime = PluginRuntime(config, stats, QueueRuntime(config, stats, lambda: 5.0), None, None)
    body = {"lpc_probability": 1.0, "lpc_conversation_id": "c1"}
    made, source = runtime.release_and_source(finished_request(body, "acme"))
    assert type(made) is TenantRelease and made.tenant == "salt=acme"
    if trusted:
        assert made.hinted and made.probability == 1.0 and source == "client"
    else:  # ignored: the fallback p, nothing pinned
        assert not made.hinted and made.probability is None and source == "fallback"


def test_by_default_no_tenant_pins_more_than_half_of_a_shared_pool() -> None:
    """Defaults (`pinned_share` 0.5): a tenant sending p = 1.0 on every release pins at most
    half of a 64-block pool once another tenant shares it, and a lone tenant is not capped."""
    queue, _, runtime = make_queue(64)
    for step in range(10):  # a lone tenant: 40 blocks pinned, nothing capped
        release(queue, runtime, take(queue, 4), hint(float(step), 1.0, "salt=a"))
    assert queue.pinned_counts() == {"salt=a": 40} and runtime.stats.pinned_share_capped == 0
    shared, _, runtime = make_queue(64)
    release(shared, runtime, take(shared, 4), TenantRelease(0.0, None, "v0", tenant="salt=v"))
    for step in range(1, 11):
        release(shared, runtime, take(shared, 4), hint(float(step), 1.0, "salt=a"))
        assert shared.pinned_counts().get("salt=a", 0) <= 32
    assert shared.pinned_counts() == {"salt=a": 32} and runtime.stats.pinned_share_capped == 2


# -- the setting ----------------------------------------------------------------------------
def test_pinned_share_is_configured_and_validated_like_the_other_fields(tmp_path: Any) -> None:
    assert PluginConfig().pinned_share == 0.5  # no tenant holds a majority of a shared pool
    assert load_config({"LPC_PINNED_SHARE": "0.25"}).pinned_share == 0.25
    assert config_from_table({"pinned_share": 1}).pinned_share == 1
    path = tmp_path / "lpc.toml"
    path.write_text("pinned_share = 0.1\n")
    assert load_config({"LPC_CONFIG": str(path)}).pinned_share == 0.1
    for text, message in (
        ("1.5", "LPC_PINNED_SHARE='1.5': pinned_share must be in [0, 1], got 1.5"),
        ("-0.1", "pinned_share must be in [0, 1]"),
        ("nan", "pinned_share must be a finite number"),
        ("half", "LPC_PINNED_SHARE='half': not a valid value for pinned_share"),
    ):
        with pytest.raises(
            PluginConfigError, match=message.replace("[", r"\[").replace("]", r"\]")
        ):
            load_config({"LPC_PINNED_SHARE": text})
    with pytest.raises(
        PluginConfigError,
        match=r"additional_config\['lpc'\]\.pinned_share must be in \[0, 1\], got 2",
    ):
        config_from_table({"pinned_share": 2})
    with pytest.raises(PluginConfigError, match="pinned_share must be a finite number"):
        PluginConfig(pinned_share="0.5")  # type: ignore[arg-type]
    path.write_text("pinned_share = 7\n")
    with pytest.raises(PluginConfigError, match=r"lpc.toml: pinned_share must be in \[0, 1\]"):
        load_config({"LPC_CONFIG": str(path)})
