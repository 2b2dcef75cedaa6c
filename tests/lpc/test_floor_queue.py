"""The floor queues (`lpc.benchmarks.floor_queue`) against vLLM's own free queue (the
transcription, `StockFreeBlockQueue`): with cached releases keyed by their order (the pooled
floor's keys grow with time) they must evict exactly as vLLM's LRU list does, whatever hits and
releases come between, or the floors' cost would not be a queue's."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from lpc.benchmarks.floor_queue import PooledFloorQueue, RunFloorQueue
from lpc.integrations.stock_queue import StockFreeBlockQueue


@dataclass(eq=False)
class Block:
    block_id: int
    prev_free_block: Block | None = None
    next_free_block: Block | None = None


def _queues(
    n: int, floor_class: type[RunFloorQueue] = RunFloorQueue
) -> tuple[StockFreeBlockQueue, RunFloorQueue, list[Block], list[Block]]:
    stock_blocks = [Block(i) for i in range(n)]
    floor_blocks = [Block(i) for i in range(n)]
    floor = floor_class(StockFreeBlockQueue(floor_blocks), n)
    return StockFreeBlockQueue(stock_blocks), floor, stock_blocks, floor_blocks


@pytest.mark.parametrize("floor_class", [RunFloorQueue, PooledFloorQueue])
@pytest.mark.parametrize("seed", range(20))
def test_the_floor_evicts_in_vllms_lru_order_under_random_hits_and_releases(
    seed: int, floor_class: type[RunFloorQueue]
) -> None:
    rng = random.Random(seed)
    n = 40
    stock, floor, stock_blocks, floor_blocks = _queues(n, floor_class)
    held: set[int] = set()  # blocks in use; every other block is free in both queues
    for _ in range(400):
        free = [i for i in range(n) if i not in held]
        op = rng.random()
        if op < 0.35 and free:  # a pop: the same blocks, in the same order
            k = rng.randint(1, min(6, len(free)))
            popped = [b.block_id for b in stock.popleft_n(k)]
            assert [b.block_id for b in floor.popleft_n(k)] == popped
            held.update(popped)
        elif op < 0.6 and free:  # a hit on a free block
            i = rng.choice(free)
            stock.remove(stock_blocks[i])
            floor.remove(floor_blocks[i])
            held.add(i)
        elif held:  # a release: cached (appended) or not (prepended), in a random order
            ids = rng.sample(sorted(held), rng.randint(1, min(5, len(held))))
            held.difference_update(ids)
            cached = rng.random() < 0.8
            for queue, blocks in ((stock, stock_blocks), (floor, floor_blocks)):
                chosen = [blocks[i] for i in ids]
                (queue.append_n if cached else queue.prepend_n)(chosen)
        assert floor.num_free_blocks == stock.num_free_blocks == n - len(held)
        listed = sorted(b.block_id for b in floor.get_all_free_blocks())
        assert listed == sorted(set(range(n)) - held)
    rest = stock.num_free_blocks
    assert [b.block_id for b in floor.popleft_n(rest)] == [
        b.block_id for b in stock.popleft_n(rest)
    ]


def test_a_release_reads_none_of_its_blocks_and_a_pop_past_the_free_count_is_refused() -> None:
    _, floor, _, blocks = _queues(4)
    floor.popleft_n(4)
    run = [blocks[2], blocks[0]]
    floor.append_n(run)
    assert floor._runs[0][2] is run  # the release's own list, kept as it came
    assert floor.num_free_blocks == 2
    with pytest.raises(ValueError, match="cannot pop 3 blocks: only 2 are free"):
        floor.popleft_n(3)
    floor.remove(blocks[2])
    floor.append_n([blocks[2]])  # released again: only its new run holds it
    assert [b.block_id for b in floor.popleft_n(2)] == [0, 2]
    assert floor.num_free_blocks == 0


def test_the_pooled_floor_keeps_each_blocks_key_and_clears_it_when_popped() -> None:
    """A release keys its blocks at least as high as their last release (max pooling); a pop
    forgets the keys of the blocks it takes."""
    _, floor, _, blocks = _queues(4, PooledFloorQueue)
    floor.popleft_n(4)
    floor.append_n([blocks[1], blocks[0]])
    first = floor._key_of[0]
    assert floor._key_of[1] == first and floor._key_of[2] == floor._key_of[3] == -math.inf
    floor.remove(blocks[0])  # hit, then released again with a new block
    floor.append_n([blocks[2], blocks[0]])
    assert floor._key_of[0] == floor._key_of[2] >= first
    assert [b.block_id for b in floor.popleft_n(1)] == [1]
    assert floor._key_of[1] == -math.inf and floor._key_of[0] > -math.inf
