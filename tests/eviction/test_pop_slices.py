"""`RunHeap.pop_n` hands a run's blocks out by C-level slices when they follow its cursor,
hits behind them, explicit parent links among them: the same victims, in the same order, as
its block-by-block loop, which a threshold above every take forces here."""

from __future__ import annotations

import random

import pytest

import eviction.run_heap as run_heap
from eviction import FreedBlocks, Release, make_evictor
from tests.properties import check_due

SEEDS = range(40)


def _drive(name: str, seed: int, slice_min: int, monkeypatch: pytest.MonkeyPatch) -> list:
    """Pops, hits and chain releases drawn from `seed`; every pop's victims, in order."""
    monkeypatch.setattr(run_heap, "SLICE_MIN", slice_min)
    rng = random.Random(seed)
    n_blocks = rng.choice([120, 400])
    evictor = make_evictor(name, n_blocks)
    evictor.reset(list(range(n_blocks)))
    in_use: list[list[int]] = []
    pops: list = []
    now = 0.0
    for step in range(150):
        now += rng.choice([0.0, 1.0, 3.0])
        op, free = rng.random(), len(evictor)
        if op < 0.45 and free:
            victims = evictor.pop_n(rng.randint(1, min(free, rng.choice([12, 90, 300]))), now)
            pops.append(victims)
            in_use.append(victims)
        elif op < 0.65 and in_use:  # a request frees its chain's tail; others hold the rest
            chain = in_use.pop(rng.randrange(len(in_use)))
            cut = rng.randint(0, len(chain) - 1)
            if cut:
                in_use.append(chain[:cut])
            tail = chain[cut:][::-1]
            freed = FreedBlocks(
                tail,
                [(cut + len(tail) - i) * 16 for i in range(len(tail))],
                [f"h{(b * 7 + seed) % 23}".encode() for b in tail],
                parent_id=chain[cut - 1] if cut else None,
                chain=True,
            )
            p = rng.choice([None, 0.1, 0.5, 0.9, rng.random()])
            evictor.push_cached(freed, Release(now, p, rng.choice(["a", "b", None])))
        elif free:  # hits on queued blocks, then held as one request's chain
            queued = sorted(evictor.free_block_ids())  # every free block, by id
            hits = rng.sample(queued, rng.randint(1, min(len(queued), rng.choice([6, 40]))))
            for block_id in hits:
                evictor.remove(block_id)
            in_use.append(hits)
        if check_due(step):  # a corrupted structure stays corrupted: caught at the next check
            evictor.check_invariants()
    evictor.check_invariants()
    pops.append(evictor.pop_n(len(evictor), now))
    return pops


@pytest.mark.parametrize("name", ["lpc", "lpc-pooled"])
def test_slices_hand_out_what_the_block_loop_does(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for seed in SEEDS:
        sliced = _drive(name, seed, 2, monkeypatch)
        assert sliced == _drive(name, seed, 10**9, monkeypatch), f"seed {seed}"
