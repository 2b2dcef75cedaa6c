"""`RunHeap._push_grouped` and `_remember_grouped`: equal neighbours share a run (a ghost),
and only they (the one-run fast path for a chain of one key and tag must not merge blocks the
general loop splits)."""

from __future__ import annotations

import pytest

from eviction.run_heap import RunHeap


def _runs(keys: list[float], tags: list[str | None]) -> list[tuple[float, str | None, list[int]]]:
    heap = RunHeap(16)
    block_ids = list(range(len(keys)))
    depths = list(range(len(keys), 0, -1))
    runs = heap._push_grouped(block_ids, depths, keys, tags)
    heap.check_invariants()
    return [(run.key, run.tag, list(run.block_ids)) for run in runs]


def test_one_key_and_tag_is_one_run() -> None:
    assert _runs([1.0, 1.0, 1.0], ["a", "a", "a"]) == [(1.0, "a", [0, 1, 2])]


@pytest.mark.parametrize(
    ("keys", "tags", "expected"),
    [
        ([1.0, 2.0, 1.0], ["a", "a", "a"], [(1.0, "a", [0]), (2.0, "a", [1]), (1.0, "a", [2])]),
        ([1.0, 1.0, 1.0], ["a", None, "a"], [(1.0, "a", [0]), (1.0, None, [1]), (1.0, "a", [2])]),
        ([1.0, 1.0, 2.0], ["a", "a", "a"], [(1.0, "a", [0, 1]), (2.0, "a", [2])]),
    ],
)
def test_unequal_neighbours_split(keys, tags, expected) -> None:
    assert _runs(keys, tags) == expected


def test_a_run_keeps_no_reference_to_the_callers_lists() -> None:
    heap = RunHeap(4)
    block_ids, depths = [0, 1], [2, 1]
    (run,) = heap._push_grouped(block_ids, depths, [1.0, 1.0], ["a", "a"])
    block_ids.append(3)
    depths.append(0)
    assert list(run.block_ids) == [0, 1] and list(run.depths) == [2, 1]


def _remembered(keys: list[float], tags: list[str | None]) -> list[tuple[float, str | None]]:
    heap = RunHeap(16)
    block_ids = list(range(len(keys)))
    heap._remember_grouped(block_ids, keys, tags)
    return [(heap._state[b].key, heap._state[b].tag) for b in block_ids]


@pytest.mark.parametrize(
    ("keys", "tags"),
    [
        ([1.0, 1.0, 1.0], ["a", "a", "a"]),
        ([1.0, 2.0, 2.0, 1.0], ["a", "a", "a", "a"]),
        ([1.0, 1.0, 1.0, 1.0], ["<shared>", "<shared>", "b", "b"]),
        ([1.0, 1.0, 3.0], [None, "a", "a"]),
    ],
)
def test_remembered_blocks_keep_their_own_key_and_tag(keys, tags) -> None:
    """Per-block metadata for blocks in use, shared by a stretch of equal neighbours only."""
    assert _remembered(keys, tags) == list(zip(keys, tags, strict=True))
    heap = RunHeap(16)
    heap._remember_grouped(list(range(len(keys))), keys, tags)
    for b in range(1, len(keys)):
        same = (keys[b], tags[b]) == (keys[b - 1], tags[b - 1])
        assert (heap._state[b] is heap._state[b - 1]) == same
