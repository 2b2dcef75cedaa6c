"""A doubly linked list of block ids: O(1) push, pop and removal anywhere.

Like vLLM's free queue, the links live in one preallocated node per block (`__slots__`
objects pointing straight at each other) with a fake head and tail, so no operation allocates
and none needs a branch for an empty list or for the ends. Links held as object references,
not as ints in lists, cost one pointer load per hop instead of an index plus an int object.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence


class _Node:
    __slots__ = ("block_id", "next", "prev")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.prev: _Node | None = None
        self.next: _Node | None = None


class BlockList:
    """Block ids in a fixed universe [0, capacity), each present at most once."""

    __slots__ = ("_head", "_nodes", "_tail", "size")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._nodes = list(map(_Node, range(capacity)))
        self._head = _Node(-1)
        self._tail = _Node(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def __contains__(self, block_id: object) -> bool:
        return (
            isinstance(block_id, int)
            and 0 <= block_id < len(self._nodes)
            and self._nodes[block_id].prev is not None
        )

    def __iter__(self) -> Iterator[int]:
        node = self._head.next
        tail = self._tail
        while node is not tail:
            yield node.block_id
            node = node.next

    def clear_to(self, block_ids: Iterable[int]) -> None:
        """Empty the list, then append `block_ids` in order."""
        for node in self._nodes:
            node.prev = node.next = None
        self._head.next = self._tail
        self._tail.prev = self._head
        self.size = 0
        self.append_n(list(block_ids))

    def append_n(self, block_ids: Sequence[int]) -> None:
        """Put blocks at the tail, in order (the last one ends up last)."""
        if not block_ids:
            return
        nodes = self._nodes
        tail = self._tail
        last = tail.prev
        for b in block_ids:
            node = nodes[b]
            node.prev = last
            last.next = node
            last = node
        last.next = tail
        tail.prev = last
        self.size += len(block_ids)

    def append(self, block_id: int) -> None:
        node = self._nodes[block_id]
        tail = self._tail
        last = tail.prev
        node.prev = last
        last.next = node
        node.next = tail
        tail.prev = node
        self.size += 1

    def prepend_n(self, block_ids: Sequence[int]) -> None:
        """Put blocks at the head, keeping their order (the first one ends up first)."""
        if not block_ids:
            return
        nodes = self._nodes
        first = self._head.next
        prev = self._head
        for b in block_ids:
            node = nodes[b]
            node.prev = prev
            prev.next = node
            prev = node
        prev.next = first
        first.prev = prev
        self.size += len(block_ids)

    def remove(self, block_id: int) -> None:
        node = self._nodes[block_id]
        prev = node.prev
        if prev is None:
            raise KeyError(f"block {block_id} is not in this list")
        nxt = node.next
        prev.next = nxt
        nxt.prev = prev
        node.prev = None
        self.size -= 1

    def popleft(self) -> int:
        node = self._head.next
        if node is self._tail:
            raise IndexError("pop from an empty block list")
        nxt = node.next
        self._head.next = nxt
        nxt.prev = self._head
        node.prev = None
        self.size -= 1
        return node.block_id

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        """Pop the first n blocks (`now_s` is accepted for the evictor interface, unused)."""
        if n > self.size:
            raise IndexError(f"cannot pop {n} blocks from a list of {self.size}")
        out = []
        node = self._head.next
        for _ in range(n):
            out.append(node.block_id)
            node.prev = None
            node = node.next
        self._head.next = node
        node.prev = self._head
        self.size -= n
        return out

    def check_invariants(self) -> None:
        """Assert the links agree both ways and `size` counts them (for tests; O(capacity))."""
        seen = 0
        node = self._head
        while node.next is not self._tail:
            nxt = node.next
            assert nxt.prev is node, f"block list: block {nxt.block_id}'s links disagree"
            node = nxt
            seen += 1
            assert seen <= len(self._nodes), "block list: the links form a cycle"
        assert self._tail.prev is node, "block list: the tail's link is stale"
        assert seen == self.size, f"block list: {seen} linked blocks but size says {self.size}"
        linked = sum(1 for n in self._nodes if n.prev is not None)
        assert linked == seen, "block list: an unlinked block still holds a link"
