"""Eviction scenarios for the SGLang strategy, run on the stand-in and on SGLang's real caches.

Each scenario takes `new_tree(clock)`, which builds an empty radix tree reading `clock`, and
returns what it observed as plain data. In our venv the tree is
`radix_standin.StandInRadixCache` with our `LPCStrategy`; in SGLang's venv it is
`lpc.drivers.sglang_radix.RealRadixCache` — SGLang's own `RadixCache` or
`UnifiedRadixCache`, whose strategy SGLang's registry built from the name "lpc" — and the
tests require the same results from all three. A tree offers `insert(tokens, priority)`,
`match(tokens)`, `lock(tokens)` / `unlock(handle)`, `node_at(tokens)`, `strategy` and
`evict(num_tokens, observe=None)`, which returns the evicted nodes (each with `key`, its
tokens, `priority` and `last_access_time`) in eviction order.
Standard library + `eviction` + `lpc.integrations.sglang_strategy` only.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from eviction.lpc import decayed_probability
from lpc.integrations.sglang_strategy import probability_to_priority

EVERYTHING = 10**9


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


NewTree = Callable[[Clock], Any]
SYSTEM = tuple(range(1000, 1040))  # a shared system prompt, 40 tokens


def conversation(tag: int, length: int = 30) -> tuple[int, ...]:
    return tuple(tag * 100_000 + i for i in range(length))


def order_by_key(new_tree: NewTree) -> dict[str, Any]:
    """Leaves of different p and age are evicted in LPC's order, not LRU's.

    A: p 0.95 released at t=1000; B: p 0.05 at t=1100; C: no prediction (priority 0, the
    fallback p) at t=1050; D: p 0.5 at t=1150. LRU would evict A first.
    """
    clock = Clock()
    tree = new_tree(clock)
    for name, p, t in (
        ("A", 0.95, 1000.0),
        ("B", 0.05, 1100.0),
        ("C", None, 1050.0),
        ("D", 0.5, 1150.0),
    ):
        clock.now = t
        priority = 0 if p is None else probability_to_priority(p)
        tree.insert(conversation(ord(name)), priority)
    names = {conversation(ord(n))[0]: n for n in "ABCD"}
    evicted = tree.evict(EVERYTHING)
    return {"order": [names[node.key[0]] for node in evicted]}


def max_pooling(new_tree: NewTree) -> dict[str, Any]:
    """A system prompt shared by two conversations carries the higher p of the two.

    X (p 0.9, t=1000) and Y (p 0.1, t=1010) share SYSTEM; Z (p 0.5, t=1010) has its own
    prefix. Evicting everything goes Y, Z, X and the shared prefix last, although its latest
    user, Y, has the lowest p: the prefix carries max(0.9, 0.1) at Y's access time.
    """
    clock = Clock()
    tree = new_tree(clock)
    clock.now = 1000.0
    tree.insert(SYSTEM + conversation(1), probability_to_priority(0.9))
    clock.now = 1010.0
    tree.insert(SYSTEM + conversation(2), probability_to_priority(0.1))
    tree.insert(conversation(3), probability_to_priority(0.5))
    labels = {
        SYSTEM[0]: "system",
        conversation(1)[0]: "X",
        conversation(2)[0]: "Y",
        conversation(3)[0]: "Z",
    }
    shared = tree.node_at(SYSTEM)
    result = {
        "shared_priority": shared.priority,
        "shared_last_access_time": shared.last_access_time,
        "shared_key": tree.strategy.get_priority(shared),
    }
    evicted = tree.evict(EVERYTHING)
    result["order"] = [labels[node.key[0]] for node in evicted]
    return result


def locked_never_evicted(new_tree: NewTree) -> dict[str, Any]:
    """A locked path (a running request's prefix) is never evicted, whatever its key.

    A (p 0.9), B (p 0.02, the lowest key) and C (p 0.5); B is locked while everything else
    is evicted, then unlocked and evicted.
    """
    clock = Clock()
    tree = new_tree(clock)
    for name, p in (("A", 0.9), ("B", 0.02), ("C", 0.5)):
        clock.now += 10
        tree.insert(conversation(ord(name)), probability_to_priority(p))
    names = {conversation(ord(n))[0]: n for n in "ABC"}
    handle = tree.lock(conversation(ord("B")))
    while_locked = [names[node.key[0]] for node in tree.evict(EVERYTHING)]
    still_cached = tree.node_at(conversation(ord("B"))) is not None
    tree.unlock(handle)
    after_unlock = [names[node.key[0]] for node in tree.evict(EVERYTHING)]
    return {"while_locked": while_locked, "b_cached": still_cached, "after_unlock": after_unlock}


def partial_node_splits(new_tree: NewTree) -> dict[str, Any]:
    """Matches and inserts that end partway into a node split it; what each part carries.

    X (20 tokens, p 0.9) at t=1000. At t=1100 a match of X[:10] + an unknown token splits X
    at 10: SGLang refreshes the node before splitting, so both X[:10] and the unmatched
    suffix X[10:] now have t=1100. At t=1200 an insert of X[:5] + Y (p 0.1) splits X[:10] at
    5: X[:5] takes max(p) and t=1200, X[5:10] is refreshed to t=1200 and keeps p 0.9, the new
    leaf Y has p 0.1. Eviction then takes Y (lowest p), X[10:] (older), X[5:10], X[:5].
    """
    clock = Clock()
    tree = new_tree(clock)
    x = conversation(7, 20)
    y = conversation(8, 6)
    tree.insert(x, probability_to_priority(0.9))
    clock.now = 1100.0
    tree.match((*x[:10], 999))
    after_match = {
        "X[:10]": tree.node_at(x[:10]).last_access_time,
        "X[10:]": tree.node_at(x).last_access_time,
    }
    clock.now = 1200.0
    tree.insert(x[:5] + y, probability_to_priority(0.1))
    parts = {"X[:5]": x[:5], "X[5:10]": x[:10], "X[10:]": x, "Y": x[:5] + y}
    after_insert = {
        label: [tree.node_at(path).priority, round(tree.node_at(path).last_access_time, 3)]
        for label, path in parts.items()
    }
    labels = {x[0]: "X[:5]", x[5]: "X[5:10]", x[10]: "X[10:]", y[0]: "Y"}
    order = [labels[node.key[0]] for node in tree.evict(EVERYTHING)]
    return {"after_match": after_match, "after_insert": after_insert, "order": order}


def random_operations(new_tree: NewTree, seed: int, with_priorities: bool) -> list[list[Any]]:
    """Random inserts, matches (with splits) and partial evictions; every eviction as
    [tokens, last_access_time].

    Keys never tie at a partial eviction: SGLang breaks ties in the order of a set of nodes,
    which differs between runs. Times are whole seconds, and an insert that splits a node
    leaves the refreshed suffix and the new leaf at the same time, so every insert is
    followed by a match of its tokens 0.2 s later. (UnifiedRadixCache stamps the ancestors
    of a match's end 1e-5 apart; rounding to 0.1 s removes that.) A full eviction's ties are
    sorted by tokens.
    """
    rng = random.Random(seed)
    clock = Clock()
    tree = new_tree(clock)
    prefixes = [tuple(rng.randrange(50) for _ in range(rng.randint(1, 6))) for _ in range(6)]
    evictions: list[list[Any]] = []

    def record(nodes: list[Any]) -> None:
        batch = [[list(n.key), round(n.last_access_time, 1)] for n in nodes]
        evictions.extend(sorted(batch, key=lambda e: (e[1], e[0])))

    for _ in range(60):
        clock.now += 1 + int(rng.expovariate(1 / 30))
        action = rng.random()
        if action < 0.6:
            tokens = rng.choice(prefixes) + tuple(
                rng.randrange(50) for _ in range(rng.randint(1, 8))
            )
            p = rng.choice((0.02, 0.2, 0.5, 0.8, 0.98, None))
            priority = 0 if p is None or not with_priorities else probability_to_priority(p)
            tree.insert(tokens, priority)
            clock.now += 0.2
            tree.match(tokens)
        elif action < 0.85:
            tree.match((*rng.choice(prefixes), rng.randrange(50)))
        else:
            record(tree.evict(rng.randint(1, 12)))
    record(tree.evict(EVERYTHING))
    return evictions


def evicts_lowest_decayed_probability(new_tree: NewTree, seed: int) -> dict[str, Any]:
    """Random trees: every eviction takes a leaf with the lowest decayed probability p_cur
    (the paper's definition) among the evictable leaves, evaluated at an arbitrary later now."""
    rng = random.Random(seed)
    clock = Clock()
    tree = new_tree(clock)
    strategy = tree.strategy
    prefixes = [tuple(rng.randrange(50) for _ in range(rng.randint(1, 6))) for _ in range(6)]
    for _ in range(40):
        clock.now += rng.expovariate(1 / 30)
        tokens = rng.choice(prefixes) + tuple(rng.randrange(50) for _ in range(rng.randint(1, 8)))
        p = rng.choice((0.02, 0.2, 0.5, 0.8, 0.98, None))
        tree.insert(tokens, 0 if p is None else probability_to_priority(p))
        if rng.random() < 0.3:
            tree.match(rng.choice(prefixes))
    later = clock.now + 500.0
    violations: list[str] = []
    checked = 0

    def p_cur(node: Any) -> float:
        p = strategy.probability(node)
        return decayed_probability(p, later - node.last_access_time, strategy.scale_per_s)

    def observe(victim: Any, candidates: list[Any]) -> None:
        nonlocal checked
        checked += 1
        lowest = min(p_cur(n) for n in candidates)
        if p_cur(victim) > lowest * (1 + 1e-9) + 1e-15:
            violations.append(f"evicted {victim} with p_cur {p_cur(victim)} > {lowest}")

    tree.evict(EVERYTHING, observe)
    return {"checked": checked, "violations": violations}
