"""The kill switch without vLLM: the mode, the control file, and each mode's eviction order.

The list reference is `eviction.LRUEvictor`, block for block vLLM's `FreeKVCacheBlockQueue`
(the differential tests against vLLM check it); the off queue is vLLM's own class (here its
transcription, `stock_queue`; against vLLM in test_kill_switch_vllm.py), and the scheduler
replay checks it against vLLM's queue too (`scripts/vllm_scheduler_replay.py`).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from eviction import LRUEvictor, Release
from lpc.integrations.config import PluginConfig, PluginConfigError, load_config
from lpc.integrations.kill_switch import ControlFileWatcher, ModeSwitch, check_mode
from lpc.integrations.stats import PluginStats
from lpc.integrations.stock_queue import StockFreeBlockQueue
from lpc.integrations.vllm_queue import (
    LPCFreeBlockQueue,
    ProtectedRelease,
    QueueRuntime,
    bind_queue_class,
)
from predictor.return_curve import ReturnCurve


@dataclass(eq=False)
class Block:
    block_id: int
    block_hash: bytes | None = None
    block_hash_num_tokens: int | None = None
    pool: Pool | None = None  # vLLM 0.33's blocks know their pool


class Pool:
    """What the queue sees of vLLM's `BlockPool`: the attribute that holds its free queue."""

    free_block_queue: object = None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_mode_switch_counts_and_refuses() -> None:
    switch = ModeSwitch()
    assert (switch.mode, switch.lru_order, switch.switches) == ("lpc", False, 0)
    assert switch.set("lru", "test") and switch.lru_order
    assert not switch.set("lru", "test"), "the same mode again is no switch"
    assert switch.set("shadow", "test") and switch.lru_order
    assert switch.set(" LPC\n", "test") and not switch.lru_order
    assert switch.counters() == {"mode": "lpc", "mode_switches": 3}
    with pytest.raises(ValueError, match="must be one of lpc, lru, shadow"):
        switch.set("fifo", "test")
    assert check_mode("Shadow") == "shadow"


def test_the_mode_is_configured_and_checked() -> None:
    assert PluginConfig().mode == "lpc"
    config = load_config({"LPC_MODE": "Shadow", "LPC_CONTROL_FILE": "/run/lpc-mode"})
    assert (config.mode, config.control_file, config.control_poll_s) == (
        "shadow",
        "/run/lpc-mode",
        1.0,
    )
    with pytest.raises(PluginConfigError, match="LPC_MODE='off'"):
        load_config({"LPC_MODE": "off"})
    with pytest.raises(PluginConfigError, match="LPC_CONTROL_POLL_S"):
        load_config({"LPC_CONTROL_POLL_S": "0"})


def test_the_control_file_switches_on_change_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mode"
    switch = ModeSwitch()
    watcher = ControlFileWatcher(path, switch)
    watcher.poll_once()
    assert switch.mode == "lpc", "no file: nothing changes"
    path.write_text("lru\n")
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.lpc"):
        watcher.poll_once()
    assert switch.mode == "lru" and switch.switches == 1
    assert f"from lpc to lru (control file {path})" in caplog.text
    switch.set("lpc", "set_mode()")
    watcher.poll_once()
    assert switch.mode == "lpc", "an unchanged file does not undo another switch"
    path.write_text("sideways")
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.lpc"):
        watcher.poll_once()
    assert switch.mode == "lpc" and "got 'sideways'; the mode stays lpc" in caplog.text
    path.write_text("SHADOW")
    watcher.poll_once()
    assert switch.mode == "shadow" and switch.switches == 3


def test_the_control_file_is_read_by_a_background_thread(tmp_path: Path) -> None:
    path = tmp_path / "mode"
    path.write_text("lru")
    switch = ModeSwitch()
    watcher = ControlFileWatcher(path, switch, poll_s=0.01)
    watcher.start()
    try:
        assert switch.mode == "lru", "a file present at start decides the first mode"
        path.write_text("lpc")
        deadline = time.monotonic() + 10
        while switch.mode != "lpc":
            assert time.monotonic() < deadline, "the watcher never read the changed file"
            time.sleep(0.01)
    finally:
        watcher.close()
    assert switch.switches == 2


@pytest.mark.parametrize("poll_s", [1e10, 0.0, -1.0, float("nan"), float("inf"), True])
def test_a_poll_interval_no_timer_can_wait_is_refused_before_the_thread_starts(
    tmp_path: Path, poll_s: float
) -> None:
    """Issue 44 case 7: with 1e10 the thread died of OverflowError and the kill switch went
    deaf; the watcher now refuses the interval where it is given."""
    with pytest.raises(ValueError, match=r"control file poll_s must be in \(0, "):
        ControlFileWatcher(tmp_path / "mode", ModeSwitch(), poll_s=poll_s)


def make_queue(evictor: str, num_blocks: int, switch: ModeSwitch, clock: Clock):
    config = PluginConfig(evictor=evictor, fallback_probability=0.5)
    runtime = QueueRuntime(config, PluginStats(), clock, mode=switch)
    pool = Pool()
    blocks = [Block(i, pool=pool) for i in range(num_blocks)]
    pool.free_block_queue = bind_queue_class(runtime)(blocks)
    return pool.free_block_queue, blocks, runtime


# Return curves the releases carry (`lpc-return` reads them; the LPC evictors do not).
CURVES = [
    None,
    ReturnCurve(np.array([0.0, 1.0, 5.0]), np.array([1.0, 0.7, 0.1])),
    ReturnCurve(np.array([0.0, 50.0, 500.0]), np.array([1.0, 0.95, 0.5])),
]


def expected_order(queue, listed: list[int], blocks) -> list[int]:
    """The free order the kill switch promises (docs/design.md, "The kill switch"): in lpc
    mode vLLM's list, then the learned order; off, the list's leading hash-less blocks, the
    learned order (what is left to drain), the rest of the list."""
    learned = queue.evictor.free_block_ids()
    if queue.phase == "lpc":
        return listed + learned
    k = 0
    while k < len(listed) and blocks[listed[k]].block_hash is None:
        k += 1
    return listed[:k] + learned + listed[k:]


@pytest.mark.parametrize(
    ("evictor", "seed"),
    [(e, seed) for e in ("lpc", "lpc-pooled") for seed in range(4)]
    + [("lpc-return", seed) for seed in range(2)],
)
def test_every_mode_evicts_as_promised_and_off_is_vllms_queue(evictor: str, seed: int) -> None:
    """Random frees (cached and not, probabilities, conversations, blocks others hold,
    preemptions), hits, allocations and mode switches. The reference is vLLM's list as the
    switch promises to keep it (`LRUEvictor`, block for block vLLM's queue): uncached
    releases always at its front, cached ones at its tail while off. Every pop and the whole
    free order are the promised ones; the calls go where vLLM sends them, to the pool's
    queue: off with nothing left to drain, in `lru` that is vLLM's own queue object, which
    leaves the plugin's hooks out (no `LPCFreeBlockQueue`)."""
    rng = random.Random(seed)
    num_blocks = 48
    switch = ModeSwitch()
    clock = Clock()
    queue, blocks, runtime = make_queue(evictor, num_blocks, switch, clock)
    listed = LRUEvictor(num_blocks)
    listed.reset(range(num_blocks))
    pool = blocks[0].pool
    in_use: list[Block] = []
    off_pops = lpc_pops_unlike_list = switches = drained = 0
    for step in range(800):
        clock.now += rng.random()
        action = rng.random()
        if action < 0.03:
            switches += switch.set(rng.choice(["lpc", "lru", "shadow"]), "test")
        elif action < 0.4 and pool.free_block_queue.num_free_blocks:
            n = rng.randint(1, min(6, pool.free_block_queue.num_free_blocks))
            want = expected_order(queue, listed.free_block_ids(), blocks)[:n]
            learned = set(queue.evictor.free_block_ids())
            engine = pool.free_block_queue
            popped = engine.popleft_n(n) if n > 1 else [engine.popleft()]
            ids = [b.block_id for b in popped]
            if evictor == "lpc-return":  # its pop re-keys first: the learned part as a set
                assert [b in learned for b in ids] == [b in learned for b in want], step
                ids_learned = [b for b in ids if b in learned]
                assert [b for b in ids if b not in learned] == [
                    b for b in want if b not in learned
                ], f"step {step}: not the promised eviction"
                assert len(ids_learned) == len(set(ids_learned) & learned)
            else:
                assert ids == want, f"step {step}: not the promised eviction"
            off_pops += n * switch.lru_order
            lpc_pops_unlike_list += not switch.lru_order and ids != listed.free_block_ids()[:n]
            for block_id in ids:
                if block_id in listed:
                    listed.remove(block_id)
            for block in popped:
                block.block_hash = block.block_hash_num_tokens = None  # evicted: new content
            in_use.extend(popped)
            if switch.lru_order and not len(queue.evictor):  # a pop found nothing to drain
                drained += 1
                assert queue.phase == "through"
                if switch.mode == "lru":
                    assert pool.free_block_queue is queue._list
                    assert type(queue._list) is StockFreeBlockQueue
                else:
                    assert pool.free_block_queue is queue
        elif action < 0.55:
            free_cached = [b for b in blocks if b.block_hash is not None and b not in in_use]
            if free_cached:
                block = rng.choice(free_cached)
                pool.free_block_queue.remove(block)
                if block.block_id in listed:
                    listed.remove(block.block_id)
                in_use.append(block)
        elif in_use:
            k = rng.randint(1, min(5, len(in_use)))
            chain = [in_use.pop(rng.randrange(len(in_use))) for _ in range(k)]
            for depth, block in enumerate(chain):
                if block.block_hash is None and rng.random() < 0.8:
                    block.block_hash = bytes([seed, step % 256, depth, block.block_id])
                if block.block_hash is not None:  # a chain is freed deepest first
                    block.block_hash_num_tokens = 16 * (depth + 1)
            freed = list(reversed(chain))  # the tail first, as vLLM frees
            kind = ProtectedRelease if rng.random() < 0.15 else Release
            release = kind(
                clock(),
                rng.choice([None, rng.random()]),
                f"c{rng.randrange(5)}",
                return_curve=rng.choice(CURVES),
            )
            cached = [b for b in freed if b.block_hash is not None]
            uncached = [b for b in freed if b.block_hash is None]
            off = switch.lru_order
            # The pool's queue read at every call, as vLLM's BlockPool does.
            pool.free_block_queue.prepend_n(uncached)  # vLLM's order: the hash-less first
            with runtime.releasing(release):
                pool.free_block_queue.append_n(cached)
                engine = pool.free_block_queue
                if rng.random() < 0.3 and isinstance(engine, LPCFreeBlockQueue):
                    shared = [b for b in in_use if b.block_hash is not None][:2]
                    engine.note_shared_release(shared, release)
            if off:
                listed.append_n([b.block_id for b in cached])
            listed.prepend_n([b.block_id for b in uncached])
        order = [b.block_id for b in queue.get_all_free_blocks()]
        assert order == expected_order(queue, listed.free_block_ids(), blocks), f"step {step}"
        # What vLLM reads: the count of the queue the pool holds.
        assert pool.free_block_queue.num_free_blocks == len(order) == num_blocks - len(in_use)
        assert pool.free_block_queue in (queue, queue._list)
        handed_over = switch.mode == "lru" and queue.phase == "through"
        # Switched on after a hand-over, the list rejoins the LPC queue at the pool's next call
        # (a rejoin still pending when switched off again hands the pool a fresh list then).
        rejoining = type(queue._list) is not StockFreeBlockQueue
        holds_list = pool.free_block_queue is queue._list
        assert (not rejoining or holds_list) and (
            switch.mode == "lru" or rejoining or not holds_list
        )
        assert isinstance(pool.free_block_queue, LPCFreeBlockQueue) != (handed_over or rejoining)
        queue.evictor.check_invariants()
    assert switches >= 3 and off_pops > 50 and drained, "the stream never exercised the switch"
    assert lpc_pops_unlike_list > 0, "LPC never differed from LRU: the check proves nothing"


def test_a_switch_off_drains_the_learned_blocks_first_then_is_vllms_queue() -> None:
    """By hand: LPC queued the low-p release first-evicted; switched off, its blocks go
    first in that order (uncached ones before them), new releases join vLLM's list behind
    them; drained, the queue is vLLM's; switched on, the list's blocks go first."""
    switch = ModeSwitch()
    clock = Clock()
    queue, _, runtime = make_queue("lpc", 8, switch, clock)
    taken = queue.popleft_n(8)
    for release_index, (ids, p) in enumerate([([0, 1], 0.9), ([2, 3], 0.1), ([4], 0.5)]):
        clock.now = float(release_index)
        chain = [taken[i] for i in ids]
        for depth, block in enumerate(chain):
            block.block_hash, block.block_hash_num_tokens = bytes([block.block_id]), 16 * depth
        with runtime.releasing(Release(clock(), p, f"c{release_index}")):
            queue.append_n(chain[::-1])
    queue.prepend_n([taken[5]])
    assert [b.block_id for b in queue.get_all_free_blocks()] == [5, 3, 2, 4, 1, 0]
    switch.set("lru", "test")
    taken[6].block_hash, taken[6].block_hash_num_tokens = b"6", 16
    queue.append_n([taken[6]])  # a release while draining: vLLM's list, behind the old ones
    queue.prepend_n([taken[7]])
    assert [b.block_id for b in queue.get_all_free_blocks()] == [7, 5, 3, 2, 4, 1, 0, 6]
    assert [b.block_id for b in queue.popleft_n(4)] == [7, 5, 3, 2]
    assert queue.phase == "draining"
    assert [b.block_id for b in queue.popleft_n(3)] == [4, 1, 0]
    pool = taken[0].pool
    assert queue.phase == "through" and pool.free_block_queue is queue._list, "vLLM's own"
    switch.set("lpc", "test")
    # vLLM's list takes the pool's next call (on the scheduler thread) back to the LPC queue.
    assert pool.free_block_queue is queue._list and queue.phase == "through"
    with runtime.releasing(Release(9.0, 0.01, "c9")):
        pool.free_block_queue.append_n([taken[0]])
    assert pool.free_block_queue is queue and queue.phase == "lpc"
    assert type(queue._list) is StockFreeBlockQueue
    assert [b.block_id for b in queue.get_all_free_blocks()] == [6, 0], "the list goes first"
    assert queue.num_free_blocks == 2
    queue.evictor.check_invariants()
