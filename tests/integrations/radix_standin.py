"""A stand-in for SGLang 0.5.23's `RadixCache`, for the fast default-suite checks.

The real `RadixCache` and `UnifiedRadixCache` run only in SGLang's own venv
(`lpc.drivers.sglang_radix`, tests marked `sglang`); this small radix tree lets the
default suite check the strategy's eviction order in milliseconds without it. It is NOT
SGLang's code; it keeps the contract a `get_priority` strategy sees, and the `sglang` tests
run the same scenarios on the real caches and on this tree and require the same results:

- a node has `priority`, `last_access_time`, `lock_ref`, `parent`, `children`, a token `key`
  that carries the request's `cache_salt` and `extra_key` (SGLang's `RadixKey`): requests of
  different ones share no node;
- `insert(tokens, priority)` walks the path from the root, setting `last_access_time` to the
  insert's time and `priority = max(priority, request priority)` on every node of the path;
  a new leaf takes the request's priority; splitting a node at a partial match gives the new
  parent its child's priority (and hit count);
- when an insert or match ends partway into a node, the node's `last_access_time` is
  refreshed BEFORE it is split, so the unmatched suffix (the old node, now a child of the
  new prefix node) is refreshed too, as SGLang does; only the new prefix node takes the
  insert's priority;
- `match(tokens)` refreshes `last_access_time` on the matched path (splitting like insert);
- `evict(n)` heapifies the evictable leaves (no children, `lock_ref == 0`, not the root) by
  `(strategy.get_priority(node), node)` — nodes compare by `last_access_time` on ties — pops
  the smallest, deletes it, and pushes its parent when that became an evictable leaf.
"""

from __future__ import annotations

import heapq
import itertools
import sys
from collections.abc import Callable, Sequence
from typing import Any


class Key(tuple):
    """Tokens with SGLang's `RadixKey` namespace (`cache_salt`, `extra_key`), kept by slices."""

    cache_salt: str | None = None
    extra_key: str | None = None

    def __new__(
        cls, tokens: Sequence[int], cache_salt: str | None = None, extra_key: str | None = None
    ) -> Key:
        key = super().__new__(cls, tokens)
        key.cache_salt, key.extra_key = cache_salt, extra_key
        return key

    def __getitem__(self, index: Any) -> Any:
        item = super().__getitem__(index)
        if isinstance(index, slice):
            return Key(item, self.cache_salt, self.extra_key)
        return item

    def child_key(self) -> Any:
        """The parent's dict key for a child starting with this key (SGLang's
        `get_child_key`: namespaced unless the key has no namespace)."""
        if self.cache_salt is None and self.extra_key is None:
            return self[0]
        return (self.extra_key, self.cache_salt, self[0])


class Node:
    _ids = itertools.count()

    def __init__(self, key: tuple[int, ...], priority: int, now: float) -> None:
        self.id = next(self._ids)
        self.key = key if isinstance(key, Key) else Key(key)
        self.children: dict[int, Node] = {}
        self.parent: Node | None = None
        self.lock_ref = 0
        self.priority = priority
        self.last_access_time = now
        self.hit_count = 0

    def __lt__(self, other: Node) -> bool:
        return self.last_access_time < other.last_access_time

    def __repr__(self) -> str:
        return f"Node({self.key[:4]}..., p={self.priority}, t={self.last_access_time})"


class StandInRadixCache:
    def __init__(self, strategy: Any, clock: Callable[[], float]) -> None:
        self.strategy = strategy
        self.clock = clock
        self.root = Node((), -sys.maxsize, clock())
        self.root.lock_ref = 1

    def _split(self, child: Node, at: int) -> Node:
        parent = child.parent
        assert parent is not None
        new = Node(child.key[:at], child.priority, child.last_access_time)
        new.hit_count = child.hit_count
        new.parent = parent
        new.lock_ref = child.lock_ref
        parent.children[new.key.child_key()] = new
        child.key = child.key[at:]
        child.parent = new
        new.children[child.key.child_key()] = child
        return new

    def _walk(self, tokens: Key, now: float, on_node: Callable[[Node], None]) -> tuple[Node, int]:
        node, done = self.root, 0
        on_node(node)
        while done < len(tokens) and tokens[done:].child_key() in node.children:
            child = node.children[tokens[done:].child_key()]
            shared = 0
            while (
                shared < len(child.key)
                and done + shared < len(tokens)
                and child.key[shared] == tokens[done + shared]
            ):
                shared += 1
            if shared < len(child.key):
                child.last_access_time = now  # SGLang refreshes the suffix, then splits
                child = self._split(child, shared)
            on_node(child)
            node, done = child, done + shared
        return node, done

    def insert(
        self,
        tokens: Sequence[int],
        priority: int = 0,
        cache_salt: str | None = None,
        extra_key: str | None = None,
    ) -> Node:
        now = self.clock()

        def touch(node: Node) -> None:
            node.last_access_time = now
            node.priority = max(node.priority, priority)

        key = Key(tokens, cache_salt, extra_key)
        node, done = self._walk(key, now, touch)
        if done < len(key):
            leaf = Node(key[done:], priority, now)
            leaf.parent = node
            node.children[leaf.key.child_key()] = leaf
            node = leaf
        return node

    def match(
        self, tokens: Sequence[int], cache_salt: str | None = None, extra_key: str | None = None
    ) -> tuple[Node, int]:
        now = self.clock()

        def touch(node: Node) -> None:
            node.last_access_time = now

        return self._walk(Key(tokens, cache_salt, extra_key), now, touch)

    def node_at(self, tokens: Sequence[int]) -> Node | None:
        """The node whose path from the root spells exactly `tokens` (None if none does)."""
        node, done = self.root, 0
        while done < len(tokens):
            child = node.children.get(Key(tokens)[done:].child_key())
            if child is None or tuple(tokens[done : done + len(child.key)]) != child.key:
                return None
            node, done = child, done + len(child.key)
        return node

    def lock(self, tokens: Sequence[int]) -> Node:
        """Lock the path of `tokens`' cached prefix, as a running request does."""
        node, _ = self.match(tokens)
        self._add_lock(node, 1)
        return node

    def unlock(self, node: Node) -> None:
        self._add_lock(node, -1)

    def _add_lock(self, node: Node, delta: int) -> None:
        while node is not self.root:
            node.lock_ref += delta
            assert node.lock_ref >= 0
            node = node.parent  # type: ignore[assignment]

    def evictable_leaves(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not self.root and not node.children and node.lock_ref == 0:
                out.append(node)
        return out

    def evict(
        self, num_tokens: int, observe: Callable[[Node, list[Node]], None] | None = None
    ) -> list[Node]:
        """Evict at least `num_tokens` tokens; `observe(victim, candidates)` sees each choice."""
        heap = [(self.strategy.get_priority(n), n) for n in self.evictable_leaves()]
        heapq.heapify(heap)
        evicted: list[Node] = []
        freed = 0
        while freed < num_tokens and heap:
            if observe is not None:
                observe(heap[0][1], [n for _, n in heap])
            _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[node.key.child_key()]
            evicted.append(node)
            freed += len(node.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (self.strategy.get_priority(parent), parent))
        return evicted
