"""An index-linked doubly linked list of block ids: O(1) push, pop and removal anywhere.

vLLM threads its free queue through the block objects themselves; we keep the links in two
flat lists indexed by block id, so no Python object is created per operation either.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

_DETACHED = -1


class BlockList:
    """Block ids in a fixed universe [0, capacity), each present at most once.

    Slots `capacity` and `capacity + 1` are a fake head and tail, so no operation needs a
    branch for an empty list or for the ends.
    """

    __slots__ = ("_head", "_next", "_prev", "_tail", "size")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._head = capacity
        self._tail = capacity + 1
        self._next = [_DETACHED] * (capacity + 2)
        self._prev = [_DETACHED] * (capacity + 2)
        self._next[self._head] = self._tail
        self._prev[self._tail] = self._head
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def __contains__(self, block_id: object) -> bool:
        return (
            isinstance(block_id, int)
            and 0 <= block_id < self._head
            and self._prev[block_id] != _DETACHED
        )

    def __iter__(self) -> Iterator[int]:
        nxt = self._next
        node = nxt[self._head]
        while node != self._tail:
            yield node
            node = nxt[node]

    def clear_to(self, block_ids: Iterable[int]) -> None:
        """Empty the list, then append `block_ids` in order."""
        for i in range(len(self._next)):
            self._next[i] = self._prev[i] = _DETACHED
        self._next[self._head] = self._tail
        self._prev[self._tail] = self._head
        self.size = 0
        self.append_n(list(block_ids))

    def append_n(self, block_ids: Sequence[int]) -> None:
        """Put blocks at the tail, in order (the last one ends up last)."""
        if not block_ids:
            return
        nxt, prv = self._next, self._prev
        tail = self._tail
        last = prv[tail]
        for b in block_ids:
            prv[b] = last
            nxt[last] = b
            last = b
        nxt[last] = tail
        prv[tail] = last
        self.size += len(block_ids)

    def append(self, block_id: int) -> None:
        nxt, prv = self._next, self._prev
        tail = self._tail
        last = prv[tail]
        prv[block_id] = last
        nxt[last] = block_id
        nxt[block_id] = tail
        prv[tail] = block_id
        self.size += 1

    def prepend_n(self, block_ids: Sequence[int]) -> None:
        """Put blocks at the head, keeping their order (the first one ends up first)."""
        if not block_ids:
            return
        nxt, prv = self._next, self._prev
        first = nxt[self._head]
        prev = self._head
        for b in block_ids:
            prv[b] = prev
            nxt[prev] = b
            prev = b
        nxt[prev] = first
        prv[first] = prev
        self.size += len(block_ids)

    def remove(self, block_id: int) -> None:
        nxt, prv = self._next, self._prev
        p = prv[block_id]
        n = nxt[block_id]
        if p == _DETACHED:
            raise KeyError(f"block {block_id} is not in this list")
        nxt[p] = n
        prv[n] = p
        nxt[block_id] = prv[block_id] = _DETACHED
        self.size -= 1

    def popleft(self) -> int:
        nxt, prv = self._next, self._prev
        first = nxt[self._head]
        if first == self._tail:
            raise IndexError("pop from an empty block list")
        n = nxt[first]
        nxt[self._head] = n
        prv[n] = self._head
        nxt[first] = prv[first] = _DETACHED
        self.size -= 1
        return first

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        """Pop the first n blocks (`now_s` is accepted for the evictor interface, unused)."""
        if n > self.size:
            raise IndexError(f"cannot pop {n} blocks from a list of {self.size}")
        nxt, prv = self._next, self._prev
        out = []
        node = nxt[self._head]
        for _ in range(n):
            out.append(node)
            following = nxt[node]
            nxt[node] = prv[node] = _DETACHED
            node = following
        nxt[self._head] = node
        prv[node] = self._head
        self.size -= n
        return out
