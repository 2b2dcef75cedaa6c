"""The kill switch against real vLLM 0.33: its own `FreeKVCacheBlockQueue` and `KVCacheBlock`s.

- the transcription the default suite uses (`stock_queue`) is vLLM's queue, call for call;
- the queue the plugin builds over vLLM's class, thrown to `lru`, hands the pool vLLM's own
  queue object once the learned blocks are drained, which evicts what a fresh vLLM queue
  given the same calls evicts, block for block;
- a switch at 100K free blocks makes the same number of calls as at 1K;
- an evictor that raises never reaches vLLM's `BlockPool` (allocate, touch, free), in any mode.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integrations.snippets import run_snippet

pytestmark = pytest.mark.vllm

SETUP = """
import json, random, sys
from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
from eviction import Release
from lpc.integrations.config import PluginConfig
from lpc.integrations.kill_switch import ModeSwitch
from lpc.integrations.stats import PluginStats
from lpc.integrations.stock_queue import StockFreeBlockQueue
from lpc.integrations.vllm_queue import QueueRuntime, bind_queue_class

class Pool:  # what the queue sees of BlockPool: the attribute that holds its free queue
    free_block_queue = None

def make(num_blocks, mode="lpc", evictor="lpc"):
    runtime = QueueRuntime(PluginConfig(evictor=evictor), PluginStats(), lambda: 0.0,
                           mode=ModeSwitch(mode))
    pool = Pool()
    blocks = [KVCacheBlock(i, pool=pool) for i in range(num_blocks)]
    pool.free_block_queue = bind_queue_class(runtime, FreeKVCacheBlockQueue)(blocks)
    return pool.free_block_queue, blocks, runtime
"""

TRANSCRIPTION = (
    SETUP
    + """
rng = random.Random(0)
sides = []
for kind in (FreeKVCacheBlockQueue, StockFreeBlockQueue):
    blocks = [KVCacheBlock(i) for i in range(40)]
    sides.append((kind(blocks), blocks, []))
log = []
for step in range(3000):
    action = rng.random()
    k = rng.randint(0, 4)
    pick = rng.random()
    results = []
    for queue, blocks, in_use in sides:
        free = queue.get_all_free_blocks()
        if action < 0.35 and free:
            n = min(k, len(free)) or 1
            got = queue.popleft_n(n) if n > 1 else [queue.popleft()]
            in_use.extend(got)
        elif action < 0.5 and free:
            block = free[int(pick * len(free))]
            queue.remove(block)
            in_use.append(block)
            got = [block]
        elif action < 0.6 and free:
            cursor = free[int(pick * len(free))]
            got = list(queue.iter_blocks_after(cursor))[:k + 1]
        elif in_use:
            m = min(len(in_use), k + 1)
            got = in_use[-m:]
            del in_use[-m:]
            if action < 0.8:
                queue.append_n(got)
            elif action < 0.9:
                queue.prepend_n(got)
            else:
                for block in got:
                    queue.append(block)
        else:
            got = []
        results.append(([b.block_id for b in got], [b.block_id for b in queue.get_all_free_blocks()],
                         queue.num_free_blocks))
    assert results[0] == results[1], (step, results)
print(json.dumps({"steps": 3000}))
"""
)


def test_the_transcription_is_vllms_queue_call_for_call(vllm_python: Path) -> None:
    out = run_snippet(vllm_python, TRANSCRIPTION)
    assert json.loads(out.splitlines()[-1]) == {"steps": 3000}


OFF_IS_STOCK = (
    SETUP
    + """
rng = random.Random(1)
queue, blocks, runtime = make(64)
# LPC mode first: cached releases in the learned evictor
for c in range(6):
    chain = queue.popleft_n(8)
    for d, block in enumerate(chain):
        block.reset_hash()
        block.set_block_hash(bytes([c, d]), 16 * (d + 1))
    with runtime.releasing(Release(float(c), rng.random(), f"c{c}")):
        queue.append_n(chain[::-1])
learned = queue.evictor.free_block_ids()
runtime.mode.set("lru", "test")
draining = queue.phase
order = [b.block_id for b in queue.get_all_free_blocks()]
uncached = [b.block_id for b in queue._list.get_all_free_blocks()]
pool = blocks[0].pool
in_use = pool.free_block_queue.popleft_n(queue.num_free_blocks)  # uncached, learned: drained
drained = queue.phase
own = type(pool.free_block_queue) is FreeKVCacheBlockQueue
queue = pool.free_block_queue  # what vLLM calls from now on
# From now on the same calls on vLLM's own queue give the same blocks, block for block.
reference_blocks = [KVCacheBlock(i) for i in range(64)]
reference = FreeKVCacheBlockQueue(reference_blocks)
reference.popleft_n(64)
back, in_use = in_use[:20], in_use[20:]
queue.append_n(back)
reference.append_n([reference_blocks[b.block_id] for b in back])
same = True
for step in range(2000):
    n = rng.randint(1, 3)
    if rng.random() < 0.5 and queue.num_free_blocks >= n:
        got = [b.block_id for b in queue.popleft_n(n)]
        same &= got == [b.block_id for b in reference.popleft_n(n)]
        in_use += [blocks[i] for i in got]
    elif in_use:
        back = [in_use.pop(rng.randrange(len(in_use))) for _ in range(min(n, len(in_use)))]
        queue.append_n(back)
        reference.append_n([reference_blocks[b.block_id] for b in back])
    same &= [b.block_id for b in queue.get_all_free_blocks()] == [
        b.block_id for b in reference.get_all_free_blocks()]
print(json.dumps({"draining": draining, "drained": drained, "vllm_methods": own, "same": same,
                  "drain_order": order == uncached + learned}))
"""
)


def test_off_is_vllms_own_queue_once_drained(vllm_python: Path) -> None:
    out = json.loads(run_snippet(vllm_python, OFF_IS_STOCK).splitlines()[-1])
    assert out == {
        "draining": "draining",
        "drained": "through",
        "vllm_methods": True,
        "same": True,
        "drain_order": True,
    }


SWITCH_CALLS = (
    SETUP
    + """
def calls(work):
    count = 0
    def profile(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call"):
            count += 1
    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return count

def costs(num_blocks):
    queue, blocks, runtime = make(num_blocks)
    for c in range(num_blocks // 1000):
        chain = queue.popleft_n(1000)
        for d, block in enumerate(chain):
            block.reset_hash()
            block.set_block_hash(b"cached", 16 * (d + 1))
        with runtime.releasing(Release(float(c), (c % 9 + 0.5) / 10, "c")):
            queue.append_n(chain[::-1])
    off = calls(lambda: runtime.mode.set("lru", "test"))
    first = calls(lambda: queue.popleft_n(16))
    queue2, _, runtime2 = make(num_blocks, "lru")
    queue2.append_n(queue2.popleft_n(1))  # hands the pool vLLM's own queue
    on = calls(lambda: runtime2.mode.set("lpc", "test"))
    return off, first, on

ModeSwitch().set("lru", "warm-up")
print(json.dumps({"small": costs(1_000), "large": costs(100_000)}))
"""
)


def test_a_switch_at_100k_free_blocks_costs_what_it_costs_at_1k(vllm_python: Path) -> None:
    out = json.loads(run_snippet(vllm_python, SWITCH_CALLS).splitlines()[-1])
    small, large = out["small"], out["large"]
    assert small[0] == large[0] and small[2] == large[2], out
    assert large[1] <= small[1] + 5, out


FAILING = (
    SETUP
    + """
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import init_none_hash, make_block_hash_with_group_id
from vllm.utils.hashing import sha256
init_none_hash(sha256)

class Failing(RuntimeError):
    pass

def fail(*args, **kwargs):
    raise Failing("injected")

results = {}
for mode in ("lpc", "lru", "shadow"):
    runtime = QueueRuntime(PluginConfig(evictor="lpc-pooled"), PluginStats(), lambda: 0.0,
                           mode=ModeSwitch(mode))
    import vllm.v1.core.block_pool as block_pool_module
    original = block_pool_module.FreeKVCacheBlockQueue
    block_pool_module.FreeKVCacheBlockQueue = bind_queue_class(runtime, FreeKVCacheBlockQueue)
    try:
        pool = BlockPool(num_gpu_blocks=48, enable_caching=True, hash_block_size=16)
    finally:
        block_pool_module.FreeKVCacheBlockQueue = original
    queue = runtime.mode.followers[-1]  # the LPC queue (off, the pool may hold vLLM's own)
    rng = random.Random(0)
    held = []
    errors = 0
    for step in range(600):
        if step == 150:
            learned = queue.evictor
            for name in ("pop_n", "remove", "push_cached", "push_protected", "note_shared_release",
                         "iter_after", "free_block_ids"):
                setattr(learned, name, fail)
            type(learned).__contains__ = fail
        if step % 97 == 0:
            runtime.mode.set(rng.choice(["lpc", "lru", "shadow"]), "test")
        try:
            action = rng.random()
            if action < 0.45 and pool.get_num_free_blocks() >= 4:
                blocks = pool.get_new_blocks(rng.randint(1, 4))
                for i, block in enumerate(blocks):
                    if rng.random() < 0.7:
                        key = make_block_hash_with_group_id(bytes([step % 256, i]), 0)
                        block.set_block_hash(key, 16 * (i + 1))
                        pool.cached_block_hash_to_block.insert(key, block)
                held.append(blocks)
            elif action < 0.6:
                cached = [b for b in pool.blocks if b.ref_cnt == 0 and b.block_hash is not None
                          and not b.is_null]
                if cached:
                    block = rng.choice(cached)
                    pool.touch([block])
                    held.append([block])
            elif action < 0.7:
                for k, _ in enumerate(pool.free_block_queue.iter_blocks_after(None)):
                    if k == 10:
                        break
            elif held:
                blocks = held.pop(rng.randrange(len(held)))
                pool.free_blocks(reversed(blocks))
        except Failing:
            errors += 1
        free = sum(1 for b in pool.blocks if b.ref_cnt == 0 and not b.is_null)
        assert pool.get_num_free_blocks() == free, (mode, step)
    del type(learned).__contains__
    results[mode] = {"errors": errors, "tripped": queue._tripped, "phase": queue.phase}
print(json.dumps(results))
"""
)


def test_no_evictor_error_reaches_vllms_block_pool_in_any_mode(vllm_python: Path) -> None:
    out = json.loads(run_snippet(vllm_python, FAILING).splitlines()[-1])
    assert set(out) == {"lpc", "lru", "shadow"}
    for mode, result in out.items():
        assert result["errors"] == 0, (mode, result)
