"""Belady evicts the block whose next use is farthest, and re-dates missed uses."""

from __future__ import annotations

import math

from eviction import BeladyEvictor, FreedBlocks, FutureUses, Release


def push_single(evictor: BeladyEvictor, block_id: int, block_hash: bytes, time_s: float) -> None:
    evictor.push_cached(FreedBlocks([block_id], [0], [block_hash]), Release(time_s))


def test_farthest_next_use_goes_first_and_never_used_before_all() -> None:
    future = FutureUses({b"soon": [5.0], b"later": [50.0], b"latest": [500.0]})
    evictor = BeladyEvictor(4, future)
    evictor.reset(range(4))
    blocks = evictor.pop_n(4)
    for block, h in zip(blocks, [b"soon", b"later", b"latest", b"never"], strict=True):
        push_single(evictor, block, h, 1.0)
    assert evictor.pop_n(4, 2.0) == [blocks[3], blocks[2], blocks[1], blocks[0]]


def test_a_use_that_passed_without_a_hit_is_re_dated() -> None:
    future = FutureUses({b"a": [10.0, 1000.0], b"b": [100.0]})
    evictor = BeladyEvictor(2, future)
    evictor.reset(range(2))
    x, y = evictor.pop_n(2)
    push_single(evictor, x, b"a", 0.0)
    push_single(evictor, y, b"b", 0.0)
    # At t=5, "a" is next used at 10 and "b" at 100: b goes first.
    assert evictor.free_block_ids()[0] == y
    # At t=20 the use of "a" at 10 passed without a hit: its next use is 1000.
    assert evictor.pop_n(1, 20.0) == [x]


def test_future_uses_lookup() -> None:
    future = FutureUses()
    future.add(3.0, [b"h"])
    future.add(1.0, [b"h"])  # out of order is kept sorted
    assert future.next_use(b"h", 0.0) == 1.0
    assert future.next_use(b"h", 1.5) == 3.0
    assert future.next_use(b"h", 3.5) == math.inf
    assert future.next_use(None, 0.0) == math.inf
