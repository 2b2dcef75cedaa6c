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
from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from itertools import groupby, repeat
from typing import Any

# A value as the memory's users read it: (conversation, time, shared then, write number).
Entry = tuple[Any, float, bool, int]
NO_ENTRY: Entry = (None, -math.inf, False, -1)  # what `get` reads for a content not held


class ContentMemory:
    """content hash → (conversation, time, shared, write), forgotten oldest write first."""

    def __init__(self) -> None:
        self._map: dict[Hashable, Entry] = {}
        # Writes in order: [write number, time, hashes, index of the first not yet forgotten].
        self._writes: deque[list[Any]] = deque()
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
        remembered as shared whatever `shared` says. A None content (a block without a hash) is not
        remembered: written with the others and dropped at once, so that the caller need not
        filter the list (None is never a key: every read of it, `get` and the expiry's, finds
        nothing)."""
        number = self._begin(time_s, contents)
        memory = self._map
        memory.update(zip(contents, repeat((conversation, time_s, shared, number))))
        if shared_contents:
            memory.update(zip(shared_contents, repeat((conversation, time_s, True, number))))
        memory.pop(None, None)

    def _begin(self, time_s: float, contents: Sequence[Hashable]) -> int:
        if self._listed > 2 * len(self._map) + 1024:
            self._compact()
        number = self._next
        self._next = number + 1
        self._writes.append([number, time_s, contents, 0])
        self._listed += len(contents)
        return number

    def forget_before(self, cutoff_s: float) -> None:
        """Forget every content last written before `cutoff_s` (writes come in time order)."""
        writes, memory = self._writes, self._map
        while writes and writes[0][1] < cutoff_s:
            number, _, contents, start = writes.popleft()
            self._listed -= len(contents) - start
            for content in contents[start:]:
                entry = memory.get(content)
                if entry is not None and entry[3] == number:
                    del memory[content]

    def forget_oldest(self, n: int) -> None:
        """Forget the `n` oldest contents (by their last write)."""
        writes, memory = self._writes, self._map
        while n > 0 and writes:
            write = writes[0]
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
                writes.popleft()

    def _compact(self) -> None:
        """Drop the hashes written again since from the write queue (amortised O(1))."""
        memory = self._map
        kept: deque[list[Any]] = deque()
        listed = 0
        for number, time_s, contents, start in self._writes:
            valid = [
                c
                for c in contents[start:]
                if (entry := memory.get(c)) is not None and entry[3] == number
            ]
            if valid:
                kept.append([number, time_s, valid, 0])
                listed += len(valid)
        self._writes = kept
        self._listed = listed

    def items(self) -> Iterator[tuple[Hashable, tuple[Any, float, bool]]]:
        """(content, (conversation, time, shared)) oldest write first, as an `OrderedDict`
        moved to the end at every write would list them."""
        memory = self._map
        seen: set[Hashable] = set()
        for number, _, contents, start in self._writes:
            for content in contents[start:]:
                entry = memory.get(content)
                if entry is not None and entry[3] == number and content not in seen:
                    seen.add(content)
                    yield content, entry[:3]

    def clear(self) -> None:
        self._map.clear()
        self._writes.clear()
        self._listed = 0
