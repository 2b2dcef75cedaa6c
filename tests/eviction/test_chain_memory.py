"""`ChainMemory` and `common_top`: the memory by chain keeps the last release under each top
hash, forgets by write order and by its size in hashes, and bisection finds the common prefix
that a block-by-block comparison finds."""

from __future__ import annotations

import random

from eviction.chain_memory import ChainEntry, ChainMemory, common_top


def _chain(prefix: str, length: int, branch: str, total: int) -> list[str]:
    """A tail-first list of chained hashes: `length` blocks of `prefix`'s chain on top, then
    `branch`'s own blocks below, `total` in all (the top hash last)."""
    top_down = [f"{prefix}{i}" for i in range(length)]
    top_down += [f"{prefix}{length}/{branch}{i}" for i in range(total - length)]
    return top_down[::-1]


def test_common_top_matches_a_block_by_block_comparison() -> None:
    rng = random.Random(7)
    for _ in range(2_000):
        shared = rng.randint(0, 12)
        a = _chain("s", shared, "a", shared + rng.randint(0, 12))
        b = _chain("s", shared, "b", shared + rng.randint(0, 12))
        expected = 0
        while expected < min(len(a), len(b)) and a[-1 - expected] == b[-1 - expected]:
            expected += 1
        assert common_top(a, b) == expected == min(shared, len(a), len(b))


def test_common_top_of_a_list_without_hashes_is_zero() -> None:
    assert common_top([None, None], [None, None]) == 0
    assert common_top([], ["x"]) == 0


def test_the_last_write_under_a_top_wins_and_expiry_keeps_a_newer_one() -> None:
    memory = ChainMemory()
    first = ChainEntry("A", 0.0, ["a1", "top"], 0)
    second = ChainEntry("B", 5.0, ["b1", "b2", "top"], 2)
    memory.write(first)
    memory.write(second)
    assert memory.get("top") is second and len(memory) == 1 and memory.held == 3
    memory.forget_before(1.0)  # the first write expires; the entry was written again since
    assert memory.get("top") is second and memory.held == 3
    memory.forget_before(6.0)
    assert memory.get("top") is None and memory.held == 0 and not memory


def test_a_list_whose_top_has_no_hash_is_not_kept() -> None:
    memory = ChainMemory()
    memory.write(ChainEntry("A", 0.0, ["x", None], 0))
    memory.write(ChainEntry("A", 0.0, [], 0))
    assert len(memory) == 0 and memory.held == 0 and memory.get(None) is None


def test_the_size_bound_forgets_the_oldest_entries_first() -> None:
    memory = ChainMemory()
    for t, top in enumerate(("p", "q", "r")):
        memory.write(ChainEntry("A", float(t), ["x", "y", top], 0))
    memory.forget_oldest(6)
    assert memory.get("p") is None and memory.get("q") is not None and memory.held == 6
    memory.clear()
    assert len(memory) == 0 and memory.held == 0
