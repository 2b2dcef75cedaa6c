"""The kill switch's costs and its fail-safe, without vLLM, by counting (never by timing).

- a switch costs O(1) on any thread: the Python and C calls of `ModeSwitch.set`, and of the
  first pop after it, are the same at 1K and 100K free blocks;
- the lazy-offload scan (`iter_blocks_after`) finds its cursor in O(log runs) and walks O(1)
  runs per run of blocks it yields, and its order index is built once, not per scan;
- an evictor that raises never reaches the caller, in any mode: the queue hands its blocks
  to vLLM's list and runs stock from then on.
The same against real vLLM blocks and queue: test_kill_switch_vllm.py.
"""

from __future__ import annotations

import gc
import random
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from eviction import Release
from lpc.integrations.config import PluginConfig
from lpc.integrations.kill_switch import ModeSwitch
from lpc.integrations.stats import PluginStats
from lpc.integrations.stock_queue import StockFreeBlockQueue
from lpc.integrations.vllm_queue import LPCFreeBlockQueue, QueueRuntime, bind_queue_class
from tests.integrations.pool_blocks import Block, Pool, allocate


def make_queue(num_blocks: int, mode: str = "lpc", evictor: str = "lpc"):
    switch = ModeSwitch(mode)
    runtime = QueueRuntime(PluginConfig(evictor=evictor), PluginStats(), lambda: 0.0, mode=switch)
    pool = Pool()
    blocks = [Block(i, pool) for i in range(num_blocks)]
    pool.free_block_queue = bind_queue_class(runtime)(blocks)
    return pool.free_block_queue, blocks, runtime


def release_chains(queue: Any, runtime: QueueRuntime, chains: int, length: int) -> None:
    """`chains` requests of `length` blocks each: allocated, cached, freed tail first with
    distinct probabilities (so every run has its own key)."""
    for c in range(chains):
        chain = queue.popleft_n(length)
        for depth, block in enumerate(chain):
            block.block_hash = b"cached"  # plain LPC reads no hash, only that there is one
            block.block_hash_num_tokens = 16 * (depth + 1)
        with runtime.releasing(Release(float(c), 0.05 + 0.9 * (c * 7919 % chains) / chains, "c")):
            queue.append_n(chain[::-1])


def calls(work: Callable[[], Any], events: tuple[str, ...] = ("call", "c_call")) -> int:
    """Python and C function calls `work` makes (`sys.setprofile`): an operation count;
    `events=("call",)` counts the Python frames alone."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in events:
            count += 1

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return count


def switch_costs(num_blocks: int) -> tuple[int, int, int, int]:
    """Calls of: a switch off with every block in the learned structure, the first pop after
    it; a switch on with every block in vLLM's list, the first pop after that."""
    queue, _, runtime = make_queue(num_blocks)
    release_chains(queue, runtime, num_blocks // 1000, 1000)
    assert len(queue.evictor) == num_blocks
    off = calls(lambda: runtime.mode.set("lru", "test"))
    first_off = calls(lambda: queue.popleft_n(16))
    assert queue.phase == "draining"
    queue, blocks, runtime = make_queue(num_blocks, "lru")  # every block in vLLM's list
    queue.append_n(queue.popleft_n(1))  # the first pop hands the pool vLLM's own queue
    assert blocks[0].pool.free_block_queue is queue._list
    on = calls(lambda: runtime.mode.set("lpc", "test"))
    first_on = calls(lambda: queue.popleft_n(16))
    assert queue.phase == "lpc" and blocks[0].pool.free_block_queue is queue
    return off, first_off, on, first_on


@pytest.mark.parametrize(
    "large_blocks", [10_000, pytest.param(100_000, marks=pytest.mark.slow)], ids=str
)
def test_a_switch_costs_the_same_at_1k_and_100k_free_blocks(large_blocks: int) -> None:
    ModeSwitch().set("lru", "warm-up")  # the logger's first record fills its caches
    small, large = switch_costs(1_000), switch_costs(large_blocks)
    # A constant number of calls either way (logging's own caching moves a few): an O(n)
    # switch would make 100K.
    assert abs(small[0] - large[0]) <= 16 and abs(small[2] - large[2]) <= 16, (small, large)
    assert large[0] < 300, f"switching off made {large[0]} calls"
    # The first pop after the switch drains 16 blocks of one run: O(1) calls, not O(n).
    assert large[1] <= small[1] + 5 and large[1] < 120, (small, large)
    assert large[3] == small[3], (small, large)


def test_switching_never_touches_a_block() -> None:
    """No block's field is read or written by a switch: it changes the queue's phase."""
    queue, blocks, runtime = make_queue(2_000)
    release_chains(queue, runtime, 2, 1000)
    before = [(b.prev_free_block, b.next_free_block, b.block_hash) for b in blocks]
    phases = set()
    for mode in ("lru", "shadow", "lpc", "shadow", "lru", "lpc"):
        runtime.mode.set(mode, "test")
        phases.add(queue.phase)
    assert before == [(b.prev_free_block, b.next_free_block, b.block_hash) for b in blocks]
    assert phases == {"lpc", "draining"} and len(queue.evictor) == 2_000


def test_the_offload_scan_finds_its_cursor_and_walks_only_what_it_yields() -> None:
    """100 runs of 50 blocks: scans of 120 blocks after cursors anywhere in the order
    yield the order's next 120 blocks, looking at no more runs than they span (+1), and the
    run index is built once across scans with releases, hits and pops between them."""
    queue, blocks, runtime = make_queue(5_000)
    release_chains(queue, runtime, 100, 50)
    learned = queue.evictor
    rng = random.Random(0)
    for step in range(10):
        order = learned.free_block_ids()  # distinct keys, no branch: the scan order
        at = rng.randrange(len(order) - 200)
        cursor = blocks[order[at]]
        runs_before = learned.scan_runs
        scanned = []
        for block in queue.iter_blocks_after(cursor):
            scanned.append(block.block_id)
            if len(scanned) == 120:
                break
        assert scanned == order[at + 1 : at + 121], f"scan {step}"
        assert learned.scan_runs - runs_before <= 120 // 50 + 2, "walked runs it did not yield"
        # Between scans the engine works: a hit, an allocation and a release.
        hit = blocks[order[rng.randrange(len(order))]]
        queue.remove(hit)
        taken = queue.popleft_n(3)
        with runtime.releasing(Release(2_000.0 + step, rng.random(), "x")):
            queue.append_n([hit])
        for block in taken:
            block.block_hash, block.block_hash_num_tokens = None, None
        queue.prepend_n(taken)
    assert learned.order_builds == 1
    assert list(queue.iter_blocks_after(blocks[queue.popleft().block_id])) == []


def test_the_offload_scan_visits_vllms_list_first_in_lpc_mode_and_the_learned_order_after() -> None:
    queue, blocks, runtime = make_queue(40)
    release_chains(queue, runtime, 3, 10)  # 30 blocks learned, 10 uncached in the list
    listed = [b.block_id for b in queue._list.get_all_free_blocks()]
    learned = queue.evictor.free_block_ids()
    assert [b.block_id for b in queue.iter_blocks_after(None)] == listed + learned
    assert [b.block_id for b in queue.iter_blocks_after(blocks[listed[-1]])] == learned
    runtime.mode.set("shadow", "test")  # draining: the same order the pops take
    assert [b.block_id for b in queue.iter_blocks_after(None)] == listed + learned
    assert [b.block_id for b in queue.iter_blocks_after(blocks[learned[4]])] == learned[5:]


class Failing(RuntimeError):
    pass


FAILING_METHODS = (
    "pop_n",
    "remove",
    "push_cached",
    "push_protected",
    "note_shared_release",
    "iter_after",
    "free_block_ids",
    "__contains__",
)


def break_evictor(queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every method of the learned evictor the queue calls raises from now on."""
    learned = queue.evictor

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise Failing("injected")

    for name in FAILING_METHODS:
        if name == "__contains__":
            monkeypatch.setattr(type(learned), name, fail)
        else:
            monkeypatch.setattr(learned, name, fail)


@pytest.mark.parametrize("start", ["lpc", "lru", "shadow"])
@pytest.mark.parametrize("seed", range(3))
def test_no_evictor_error_reaches_the_caller_in_any_mode(
    start: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A random stream of vLLM's calls with switches; at a random step every evictor method
    starts raising. Nothing raises to the caller, no free block is lost or doubled, and a
    queue whose evictor failed on a pop, a hit or a scan runs vLLM's list from then on."""
    rng = random.Random(seed)
    queue, blocks, runtime = make_queue(64, start, "lpc-pooled")
    break_at = rng.randrange(50, 250)
    in_use: list[Block] = []
    for step in range(400):
        if step == break_at:
            break_evictor(queue, monkeypatch)
        action = rng.random()
        if action < 0.03:
            runtime.mode.set(rng.choice(["lpc", "lru", "shadow"]), "test")
        elif action < 0.35 and blocks[0].pool.free_block_queue.num_free_blocks:
            engine = blocks[0].pool.free_block_queue
            n = rng.randint(1, min(6, engine.num_free_blocks))
            in_use.extend(allocate(engine, n, step))
        elif action < 0.5:
            free_cached = [b for b in blocks if b.ref_cnt == 0 and b.block_hash is not None]
            if free_cached:
                block = rng.choice(free_cached)
                blocks[0].pool.free_block_queue.remove(block)
                block.ref_cnt = 1
                in_use.append(block)
        elif action < 0.6:
            cursor = rng.choice([None, rng.choice(blocks)])
            for k, _ in enumerate(blocks[0].pool.free_block_queue.iter_blocks_after(cursor)):
                if k == 20:
                    break
        elif in_use:
            k = min(len(in_use), rng.randint(1, 4))
            chain = [in_use.pop(rng.randrange(len(in_use))) for _ in range(k)]
            for depth, block in enumerate(chain):
                block.ref_cnt = 0
                if rng.random() < 0.8:
                    block.block_hash = bytes([seed, step % 256, depth, block.block_id])
                    block.block_hash_num_tokens = 16 * (depth + 1)
            freed = chain[::-1]
            release = Release(float(step), rng.random(), f"c{rng.randrange(4)}")
            pool = blocks[0].pool  # read at every call, as vLLM's BlockPool does
            pool.free_block_queue.prepend_n([b for b in freed if b.block_hash is None])
            with runtime.releasing(release):
                pool.free_block_queue.append_n([b for b in freed if b.block_hash is not None])
                engine = pool.free_block_queue
                if isinstance(engine, LPCFreeBlockQueue):
                    shared = [b for b in in_use if b.block_hash is not None][:2]
                    engine.note_shared_release(shared, release)
        free = [b for b in blocks if b.ref_cnt == 0]
        # What vLLM reads: the count of whichever queue the pool holds (in `lru`, drained,
        # vLLM's list; the LPC queue counts again when it takes the pool back).
        engine = blocks[0].pool.free_block_queue
        assert engine.num_free_blocks == len(free), f"step {step}: free blocks miscounted"
    if queue._tripped:
        assert queue.phase == "through" and not len(queue.evictor), "tripped: vLLM's list"
        engine = blocks[0].pool.free_block_queue
        assert engine.num_free_blocks == len(queue._list.get_all_free_blocks())
        assert runtime.stats.snapshot()["plugin_errors"] > 0
        runtime.mode.set("lpc" if runtime.mode.mode != "lpc" else "shadow", "test")
        runtime.mode.set("lpc", "test")
        assert queue.phase == "through", "a tripped queue stays off"
    runtime.mode.set("lru", "test")
    engine = blocks[0].pool.free_block_queue
    engine.popleft_n(engine.num_free_blocks)  # whatever was left to drain, then vLLM's list
    assert blocks[0].pool.free_block_queue is queue._list, "lru: the pool holds vLLM's queue"


def test_the_lpc_queue_outlives_the_handover_and_comes_back_on() -> None:
    """Off in `lru`, the pool holds only vLLM's queue object; the switch keeps the LPC queue,
    so switching on gives it back, with the list's blocks going first."""
    queue, blocks, runtime = make_queue(8, "lru")
    pool = blocks[0].pool
    pool.free_block_queue.popleft()  # the first pop hands the pool vLLM's own queue
    assert pool.free_block_queue is queue._list
    del queue
    gc.collect()
    runtime.mode.set("lpc", "test")
    # The pool's next call (on the scheduler thread) hands the pool back to the LPC queue.
    assert pool.free_block_queue.num_free_blocks == 8 - 1
    assert [b.block_id for b in pool.free_block_queue.popleft_n(7)] == list(range(1, 8))
    assert isinstance(pool.free_block_queue, LPCFreeBlockQueue)


def test_a_drain_pop_takes_the_lists_hashless_blocks_at_once_and_counts_no_eviction() -> None:
    """Off, a pop takes the list's leading hash-less blocks (in the list's order) by one of
    vLLM's `popleft_n`, not one `popleft` each, stops at the list's first cached block, then
    drains the learned blocks; the drain counts no eviction (vLLM's queue counts none either),
    while in `lpc` the same pop from the learned evictor counts each."""
    queue, blocks, runtime = make_queue(4_000)
    release_chains(queue, runtime, 2, 1_000)  # 2,000 learned; 2,000 hash-less in the list
    hashless = [b.block_id for b in blocks if b.prev_free_block is not None]
    assert len(hashless) == 2_000
    runtime.mode.set("lru", "test")
    released = queue.popleft_n(1_500)[-1]
    released.block_hash = b"cached"  # released while off: to the list's tail, behind them
    queue.append_n([released])
    learned = set(queue.evictor.free_block_ids())
    popped: list[Any] = []
    frames = calls(lambda: popped.extend(queue.popleft_n(900)), ("call",))
    ids = [b.block_id for b in popped]
    assert ids[:500] == hashless[1_500:]  # the list's hash-less blocks, then ...
    assert set(ids[500:]) <= learned and len(set(ids[500:])) == 400  # ... the learned ones
    assert released.block_id not in ids  # the cached block in the list waits behind them
    assert frames < 60, f"a drain pop opened {frames} Python frames"
    assert runtime.stats.snapshot()["evictions"] == 0
    runtime.mode.set("lpc", "test")
    queue.popleft_n(queue._list.num_free_blocks)
    queue.popleft_n(10)
    assert runtime.stats.snapshot()["evictions"] == 10


def test_switches_from_another_thread_never_miscount_the_free_blocks_vllm_reads() -> None:
    """vLLM reads `num_free_blocks` from the pool's queue at any time; only the scheduler
    thread may write the LPC queue's count. A thread switching modes as fast as it can while
    this one allocates, hits and frees: after every call the count of the queue the pool
    holds is the number of free blocks, and a pop never asks for more than that. Thread
    switches are forced every microsecond, so that a switch lands inside the calls."""
    _, blocks, runtime = make_queue(96, "lpc")
    pool = blocks[0].pool
    stop = threading.Event()
    switches = 0

    def switcher() -> None:
        nonlocal switches
        rng = random.Random(1)
        while not stop.is_set():
            switches += runtime.mode.set(rng.choice(["lpc", "lru", "shadow"]), "test")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=switcher)
    thread.start()
    try:
        rng = random.Random(0)
        in_use: list[Block] = []
        for step in range(3000):
            action = rng.random()
            free = pool.free_block_queue.num_free_blocks
            if action < 0.4 and free:
                in_use.extend(allocate(pool.free_block_queue, rng.randint(1, min(6, free)), step))
            elif action < 0.55:
                cached = [b for b in blocks if b.ref_cnt == 0 and b.block_hash is not None]
                if cached:
                    block = rng.choice(cached)
                    pool.free_block_queue.remove(block)
                    block.ref_cnt = 1
                    in_use.append(block)
            elif in_use:
                chain = [in_use.pop(rng.randrange(len(in_use))) for _ in range(min(3, len(in_use)))]
                for depth, block in enumerate(chain):
                    block.ref_cnt = 0
                    block.block_hash = bytes([step % 256, depth, block.block_id])
                    block.block_hash_num_tokens = 16 * (depth + 1)
                with runtime.releasing(Release(float(step), rng.random(), f"c{step % 5}")):
                    pool.free_block_queue.append_n(chain[::-1])
            actual = sum(b.ref_cnt == 0 for b in blocks)
            assert pool.free_block_queue.num_free_blocks == actual, f"step {step}"
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert switches > 100, "the switches never overlapped the calls"
    assert runtime.stats.snapshot()["plugin_errors"] == 0


def test_a_switch_on_rejoins_at_the_pools_next_call_with_a_fresh_list() -> None:
    """Switched on while the pool holds vLLM's list, the list keeps vLLM's count and takes
    the pool's next call (the scheduler thread's) back to the LPC queue; its state moves to a
    fresh object of vLLM's class (an assigned class would keep the object on the slow path).
    Switched off before that call, the call hands the pool the fresh list instead. A call
    still made on a stale list object goes to the queue the pool holds."""
    queue, blocks, runtime = make_queue(8, "lru")
    pool = blocks[0].pool
    pool.free_block_queue.popleft()  # the first pop hands the pool vLLM's own queue
    old = pool.free_block_queue
    assert old is queue._list
    runtime.mode.set("lpc", "test")
    assert pool.free_block_queue is old and old.num_free_blocks == 7
    runtime.mode.set("lru", "test")
    assert pool.free_block_queue.popleft().block_id == 1
    fresh = pool.free_block_queue
    assert fresh is queue._list and fresh is not old and type(fresh) is StockFreeBlockQueue
    assert fresh.num_free_blocks == 6
    runtime.mode.set("lpc", "test")
    assert [b.block_id for b in pool.free_block_queue.popleft_n(2)] == [2, 3]
    assert pool.free_block_queue is queue and type(queue._list) is StockFreeBlockQueue
    assert queue.num_free_blocks == 4
    assert [b.block_id for b in old.popleft_n(1)] == [4]  # stale: the pool's queue takes it
    assert [b.block_id for b in fresh.popleft_n(1)] == [5]
    assert queue.num_free_blocks == 2 and queue._list.num_free_blocks == 2
