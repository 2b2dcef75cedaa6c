"""`ContentMemory` forgets, and keeps, exactly what an `OrderedDict` moved to the end at every
write does: the order `lpc-pooled`'s hash memory had, which its keys depend on."""

from __future__ import annotations

import random
from collections import OrderedDict

from hypothesis import given

from eviction.content_memory import COMPACT_MIN, COMPACT_PER_CONTENT, ContentMemory
from tests.properties import SEEDS, examples

CONTENT_NAMES = [f"h{i}" for i in range(12)]


class OrderedReference:
    """The memory as `lpc-pooled` kept it: an OrderedDict, moved to the end on every write."""

    def __init__(self) -> None:
        self.map: OrderedDict[str, tuple] = OrderedDict()

    def write(self, contents: list[str | None], value: tuple, shared: tuple = ()) -> None:
        """One release: `value` for each content, its shared flag set for those in `shared`."""
        contents = [c for c in contents if c is not None]  # no hash: not remembered
        if any(c in self.map for c in contents):
            for c in contents:
                self.map.pop(c, None)
        self.map.update((c, (*value[:2], True) if c in shared else value) for c in contents)

    def forget_before(self, cutoff: float) -> None:
        while self.map and next(iter(self.map.values()))[1] < cutoff:
            self.map.popitem(last=False)

    def forget_oldest(self, n: int) -> None:
        for _ in range(min(n, len(self.map))):
            self.map.popitem(last=False)


@examples(100)
@given(seed=SEEDS)
def test_the_memory_is_an_ordered_dict_moved_to_the_end_at_every_write(seed: int) -> None:
    """A stream drawn from `seed` (the draws Hypothesis made one by one before, at a fraction
    of their cost): 1 to 60 steps of writes (some with shared contents), cutoffs and oldest-first forgetting."""
    rng = random.Random(seed)

    def some(at_least: int, none: bool) -> list[str | None]:
        return [
            None if none and rng.random() < 0.2 else rng.choice(CONTENT_NAMES)
            for _ in range(rng.randint(at_least, 8))
        ]

    memory, reference = ContentMemory(), OrderedReference()
    now = 0.0
    for _ in range(rng.randint(1, 60)):
        now += rng.choice([0.0, 0.0, 1.0, 5.0])
        action = rng.choice(["write", "write", "mixed", "before", "oldest"])
        if action == "write":
            contents = some(1, none=True)
            # What the fast path reads first: each remembered content's entry (before).
            found = memory.entries(contents)
            assert set(found) == {memory.get(c) for c in contents if c is not None} - {None}
            shared = rng.random() < 0.5
            memory.write(contents, "c", now, shared)
            reference.write(contents, ("c", now, shared))
        elif action == "mixed":  # a pooled release: distinct contents, some shared
            contents = rng.sample(CONTENT_NAMES, rng.randint(1, 8))
            shared_contents = [c for c in contents if rng.random() < 0.5]
            memory.write(contents, "d", now, False, shared_contents)
            reference.write(contents, ("d", now, False), tuple(shared_contents))
        elif action == "before":
            cutoff = now - rng.choice([0.0, 2.0, 6.0])
            memory.forget_before(cutoff)
            reference.forget_before(cutoff)
        else:
            n = rng.randint(0, 6)
            memory.forget_oldest(n)
            reference.forget_oldest(n)
        assert list(memory.items()) == list(reference.map.items())
        assert len(memory) == len(reference.map)
        assert memory.get(None) is None
        for content in reference.map:
            assert memory.get(content)[:3] == reference.map[content]


def test_writes_written_again_are_compacted_away() -> None:
    """A content written again and again leaves its old writes stale: the queue of writes
    is compacted, so it stays within twice the memory's size (plus a constant)."""
    memory, reference = ContentMemory(), OrderedReference()
    for t in range(5_000):
        contents = ["system-prompt", f"turn-{t % 3}"]
        memory.write(contents, "c", float(t), False)
        reference.write(contents, ("c", float(t), False))
    assert len(memory) == 4
    assert memory._listed <= 2 * len(memory) + 1024 + 2
    assert list(memory.items()) == list(reference.map.items())
    assert [content for content, _ in memory.items()][-2:] == ["system-prompt", "turn-1"]


class CountingDict(dict):
    """The memory's map, counting its reads: what compaction examines."""

    reads = 0

    def get(self, key, default=None):  # type: ignore[override]
        CountingDict.reads += 1
        return super().get(key, default)


def test_compaction_is_bounded_per_write_and_keeps_the_ordered_dicts_contents() -> None:
    """Thousands of writes that mostly rewrite a few contents, forgotten only past a long
    window: the stale listings are dropped by a rolling pass that reads at most its budget
    (plus one write) per write, the queue stays bounded, and what the memory holds, in
    order, stays the `OrderedDict`'s."""
    rng = random.Random(7)
    memory, reference = ContentMemory(), OrderedReference()
    memory._map = CountingDict()
    most_read = compacting_writes = 0
    now = 0.0
    for t in range(1, 6_001):
        now += 0.5
        contents = rng.sample(CONTENT_NAMES, rng.randint(1, 8))
        CountingDict.reads = 0
        memory.write(contents, "c", now, False)
        compacting_writes += CountingDict.reads > 0
        most_read = max(most_read, CountingDict.reads - len(contents) * COMPACT_PER_CONTENT)
        reference.write(contents, ("c", now, False))
        if t % 1_500 == 0:
            memory.forget_before(now - 500.0)
            reference.forget_before(now - 500.0)
            assert list(memory.items()) == list(reference.map.items())
    assert compacting_writes > 100, "the stream must keep the compaction busy"
    assert most_read <= COMPACT_MIN + 8, "a write read more than its compaction budget"
    listed = sum(len(write[2]) - write[3] for write in memory._writes[memory._head :])
    assert (
        listed == memory._listed <= 2 * len(memory) + 1024 + COMPACT_PER_CONTENT * 8 + COMPACT_MIN
    )
    memory.forget_oldest(5)
    reference.forget_oldest(5)
    assert list(memory.items()) == list(reference.map.items())
