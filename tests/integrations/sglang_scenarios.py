"""Eviction scenarios for the SGLang strategy, run here and inside SGLang's venv.

Each returns what it observed as plain data, so the same scenario can run in our venv with
our `LPCStrategy` and in SGLang's venv with the strategy SGLang's own registry builds
(`get_eviction_strategy("lpc", ...)`), and the test compares both with the expectation.
Standard library + `eviction` + `lpc.integrations.sglang_strategy` only.
"""

from __future__ import annotations

import random
from typing import Any

from eviction.lpc import decayed_probability
from lpc.integrations.sglang_strategy import probability_to_priority
from tests.integrations.radix_standin import Node, StandInRadixCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


SYSTEM = tuple(range(1000, 1040))  # a shared system prompt, 40 tokens


def conversation(tag: int, length: int = 30) -> tuple[int, ...]:
    return tuple(tag * 100_000 + i for i in range(length))


def order_by_key(strategy: Any) -> dict[str, Any]:
    """Leaves of different p and age are evicted in LPC's order, not LRU's.

    A: p 0.95 released at t=1000; B: p 0.05 at t=1100; C: no prediction (priority 0, the
    fallback p) at t=1050; D: p 0.5 at t=1150. LRU would evict A first.
    """
    clock = Clock()
    tree = StandInRadixCache(strategy, clock)
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
    evicted = tree.evict(10**9)
    return {"order": [names[node.key[0]] for node in evicted]}


def max_pooling(strategy: Any) -> dict[str, Any]:
    """A system prompt shared by two conversations carries the higher p of the two.

    X (p 0.9, t=1000) and Y (p 0.1, t=1010) share SYSTEM; Z (p 0.5, t=1010) has its own
    prefix. Evicting everything goes Y, Z, X and the shared prefix last, although its latest
    user, Y, has the lowest p: the prefix carries max(0.9, 0.1) at Y's access time.
    """
    clock = Clock()
    tree = StandInRadixCache(strategy, clock)
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
    shared = tree.root.children[SYSTEM[0]]
    evicted = tree.evict(10**9)
    return {
        "order": [labels[node.key[0]] for node in evicted],
        "shared_priority": shared.priority,
        "shared_last_access_time": shared.last_access_time,
        "shared_key": strategy.get_priority(shared),
    }


def evicts_lowest_decayed_probability(strategy: Any, seed: int) -> dict[str, Any]:
    """Random trees: every eviction takes a leaf with the lowest decayed probability p_cur
    (the paper's definition) among the evictable leaves, evaluated at an arbitrary later now."""
    rng = random.Random(seed)
    clock = Clock()
    tree = StandInRadixCache(strategy, clock)
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

    def p_cur(node: Node) -> float:
        p = strategy.probability(node)
        return decayed_probability(p, later - node.last_access_time, strategy.scale_per_s)

    def observe(victim: Node, candidates: list[Node]) -> None:
        nonlocal checked
        checked += 1
        lowest = min(p_cur(n) for n in candidates)
        if p_cur(victim) > lowest * (1 + 1e-9) + 1e-15:
            violations.append(f"evicted {victim} with p_cur {p_cur(victim)} > {lowest}")

    tree.evict(10**9, observe)
    return {"checked": checked, "violations": violations}
