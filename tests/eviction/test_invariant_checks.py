"""`check_invariants` catches the corruptions it exists for (so the property tests can fail)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from eviction import FreedBlocks, Release, make_evictor


def loaded(name: str, num_blocks: int = 12):
    """An evictor with three cached chains released at the same time (so lpc ties them)."""
    evictor = make_evictor(name, num_blocks)
    evictor.reset(range(num_blocks))
    blocks = evictor.pop_n(9)
    for start in range(0, 9, 3):
        chain = blocks[start : start + 3]
        evictor.push_cached(
            FreedBlocks(chain[::-1], [2, 1, 0], [bytes([b]) for b in chain]),
            Release(1.0, 0.5, f"c{start}"),
        )
    evictor.check_invariants()
    return evictor


def _lpc_live_count(evictor) -> None:
    next(evictor._runs()).live += 1


def _lpc_late_rank(evictor) -> None:
    key, rank, seq, run = evictor._heap[-1]  # a leaf: a later rank keeps the heap order
    evictor._heap[-1] = (key, rank + 5, seq, run)


def _lpc_heap_order(evictor) -> None:
    heap = evictor._heap  # three runs tied on the key: the oldest must be the root
    heap[0], heap[-1] = heap[-1], heap[0]


def _lru_size(evictor) -> None:
    evictor.size += 1


def _s3fifo_frequency(evictor) -> None:
    evictor._freq[next(iter(evictor._small))] = 7


def _sieve_hand(evictor) -> None:
    evictor._hand = 11  # a block that is not in the queue


def _arc_target(evictor) -> None:
    evictor.target_t1 = -1.0


def _resident_count(evictor) -> None:
    evictor._num_free -= 1


def _wa_queue_tag(evictor) -> None:
    block = next(iter(next(iter(evictor._queues.values()))))
    evictor._category[block] = "chat_9"


def _sae_idle_count(evictor) -> None:
    next(iter(evictor._sessions.values())).free += 1


def _sae_stale_score(evictor) -> None:
    next(iter(evictor._sessions.values())).hits += 3.0  # bumped without re-queueing


def _lhd_group(evictor) -> None:
    block = next(iter(next(iter(evictor._groups.values()))))
    evictor._tick[block] += 1


def _lhd_explorer_budget(evictor) -> None:
    evictor.explorer_budget += 1


def _session_ref_count(evictor) -> None:
    evictor._refs[evictor.free_block_ids()[0]] += 1


CORRUPTIONS: list[tuple[str, Callable]] = [
    ("lpc", _lpc_live_count),
    ("lpc", _lpc_late_rank),
    ("lpc", _lpc_heap_order),
    ("lru", _lru_size),
    ("s3fifo", _s3fifo_frequency),
    ("sieve", _sieve_hand),
    ("arc", _arc_target),
    ("arc", _resident_count),
    ("wa", _wa_queue_tag),
    ("sae", _sae_idle_count),
    ("sae", _sae_stale_score),
    ("lhd", _lhd_group),
    ("lhd", _lhd_explorer_budget),
    ("session-ref", _session_ref_count),
]


@pytest.mark.parametrize(("name", "corrupt"), CORRUPTIONS, ids=[c.__name__ for _, c in CORRUPTIONS])
def test_check_invariants_catches_corruption(name: str, corrupt: Callable) -> None:
    evictor = loaded(name)
    corrupt(evictor)
    with pytest.raises(AssertionError):
        evictor.check_invariants()
