"""The last release of each content hash, oldest write first: `lpc-pooled`'s hash memory.

An `OrderedDict` keeps this order by moving an entry to the end at every write, one Python-level
step per hash (its `update` is written in Python). Here the map is a plain dict and the order
is a queue of writes, one per release: a release hands over its hash list as it is (no pass),
and an entry is valid in the write that stamped it last (its sequence number). Expiry walks the
queue from the front and skips entries written again since, so the order of the entries it
forgets, and what stays, are the `OrderedDict`'s exactly (docs/design.md,
"`lpc-pooled`'s details (`eviction/lpc_pooled.py`)").
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Sequence
from itertools import groupby, repeat
from typing import Any

# While the write queue lists over twice the memory's size (plus 1,024), each write first drops
# the stale hashes among this many listed ones per hash it writes (plus COMPACT_MIN): a rolling
# pass, bounded per write (`_compact_some`). Speed only: what the memory holds is the same.
COMPACT_PER_CONTENT = 4
COMPACT_MIN = 64
# A value as the memory's users read it: (conversation, time, shared then, write number).
Entry = tuple[Any, float, bool, int]
# A `lookup` default for contents the memory does not hold: written before any time.
NO_ENTRY: Entry = (None, -math.inf, False, -1)


class ContentMemory:
    """content hash → (conversation, time, shared, write), forgotten oldest write first."""

    def __init__(self) -> None:
        self._map: dict[Hashable, Entry] = {}
        # Writes in order from `_head` on (those before it are forgotten): [write number,
        # time, hashes, index of the first not yet forgotten].
        self._writes: list[list[Any]] = []
        self._head = 0
        self._cursor = 0  # where the rolling compaction goes on (`_compact_some`)
        self._next = 0
        self._listed = 0  # hashes the writes list (stale ones included): bounds compaction

    def __len__(self) -> int:
        return len(self._map)

    def __bool__(self) -> bool:
        return bool(self._map)

    def get(self, content: Hashable) -> Entry | None:
        return self._map.get(content)

    def lookup(self, contents: Sequence[Hashable | None], default: Any = None) -> list[Any]:
        """The entry of each content (`default` for one not held), by one C-level pass."""
        return list(map(self._map.get, contents, repeat(default)))

    def entries(self, contents: Sequence[Hashable | None]) -> list[Entry]:
        """The entries of `contents`, equal neighbours once (a C-level pass; a chain's are
        those of the few writes it came from, each one tuple shared by its contents, which
        `groupby` compares by identity first). Not a set: a set hashes every entry, a tuple,
        at each block. A None content has no entry."""
        found = [entry for entry, _ in groupby(map(self._map.get, contents))]
        return [entry for entry in found if entry is not None]

    def write(
        self,
        contents: Sequence[Hashable | None],
        conversation: Any,
        time_s: float,
        shared: bool,
        shared_contents: Sequence[Hashable] = (),
    ) -> None:
        """Every content of one release, at once: `contents` is kept, not copied (pass a
        list nobody mutates afterwards); those also in `shared_contents` (a subset) are
        remembered as shared whatever `shared` says. A None content (a block without a hash)
        is not remembered: written with the others and dropped at once, so that the caller
        need not filter the list (None is never a key: every read of it, `get` and the
        expiry's, finds nothing)."""
        number = self._begin(time_s, contents)
        memory = self._map
        memory.update(zip(contents, repeat((conversation, time_s, shared, number))))
        if shared_contents:
            memory.update(zip(shared_contents, repeat((conversation, time_s, True, number))))
        memory.pop(None, None)

    def _begin(self, time_s: float, contents: Sequence[Hashable]) -> int:
        if self._listed > 2 * len(self._map) + 1024:
            self._compact_some(COMPACT_PER_CONTENT * len(contents) + COMPACT_MIN)
        number = self._next
        self._next = number + 1
        self._writes.append([number, time_s, contents, 0])
        self._listed += len(contents)
        return number

    def _pop_oldest(self) -> None:
        """The oldest write leaves the queue (the list itself is cut, amortised O(1))."""
        writes = self._writes
        writes[self._head] = None  # type: ignore[call-overload]
        self._head += 1
        if self._head > 1024 and 2 * self._head > len(writes):
            del writes[: self._head]
            self._cursor = max(0, self._cursor - self._head)
            self._head = 0

    def forget_before(self, cutoff_s: float) -> None:
        """Forget every content last written before `cutoff_s` (writes come in time order)."""
        writes, memory = self._writes, self._map
        while self._head < len(writes) and writes[self._head][1] < cutoff_s:
            number, _, contents, start = writes[self._head]
            self._pop_oldest()
            self._listed -= len(contents) - start
            for content in contents[start:]:
                entry = memory.get(content)
                if entry is not None and entry[3] == number:
                    del memory[content]

    def forget_oldest(self, n: int) -> None:
        """Forget the `n` oldest contents (by their last write)."""
        writes, memory = self._writes, self._map
        while n > 0 and self._head < len(writes):
            write = writes[self._head]
            number, _, contents, i = write
            end = len(contents)
            while i < end and n > 0:
                content = contents[i]
                i += 1
                entry = memory.get(content)
                if entry is not None and entry[3] == number:
                    del memory[content]
                    n -= 1
            self._listed -= i - write[3]
            write[3] = i
            if i == end:
                self._pop_oldest()

    def _compact_some(self, budget: int) -> None:
        """Drop the hashes written again since from about `budget` listed hashes of the write
        queue, going on from where the last call stopped (oldest write after the newest):
        a rolling pass, O(budget) per write, where one pass over the whole queue stalled the
        release that triggered it (milliseconds at 11K tokens a release). While the queue
        lists over twice the memory's size, over half of what a pass reads is stale, so a
        pass drops more than the writes add meanwhile. A write left empty stays in the queue
        until it is the oldest."""
        writes, memory = self._writes, self._map
        head, count = self._head, len(self._writes)
        i = self._cursor if head <= self._cursor < count else head
        for _ in range(count - head):
            if budget <= 0:
                break
            write = writes[i]
            number, _, contents, start = write
            if start < len(contents):
                live = contents[start:]
                valid = [c for c in live if (e := memory.get(c)) is not None and e[3] == number]
                self._listed -= len(live) - len(valid)
                write[2], write[3] = valid, 0
                budget -= len(live)
            i = i + 1 if i + 1 < count else head
        self._cursor = i

    def items(self) -> Iterator[tuple[Hashable, tuple[Any, float, bool]]]:
        """(content, (conversation, time, shared)) oldest write first, as an `OrderedDict`
        moved to the end at every write would list them."""
        memory = self._map
        seen: set[Hashable] = set()
        for number, _, contents, start in self._writes[self._head :]:
            for content in contents[start:]:
                entry = memory.get(content)
                if entry is not None and entry[3] == number and content not in seen:
                    seen.add(content)
                    yield content, entry[:3]

    def clear(self) -> None:
        self._map.clear()
        self._writes.clear()
        self._head = self._cursor = 0
        self._listed = 0
