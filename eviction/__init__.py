"""Eviction policies for a prefix-caching block manager (pure Python, no other dependencies).

`make_evictor(name, num_blocks, **options)` builds any registered policy; see `base.Evictor`
for the contract a block manager relies on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eviction.base import Evictor, FreedBlocks, Release, check_probability
from eviction.belady import BeladyEvictor, FutureUses
from eviction.fifo import FIFOEvictor
from eviction.lfu import LFUEvictor
from eviction.lpc import LPCEvictor, decayed_probability, static_key
from eviction.lru import LRUEvictor

EVICTORS: dict[str, Callable[..., Evictor]] = {
    LRUEvictor.name: LRUEvictor,
    LPCEvictor.name: LPCEvictor,
    FIFOEvictor.name: FIFOEvictor,
    LFUEvictor.name: LFUEvictor,
    BeladyEvictor.name: BeladyEvictor,
}


def make_evictor(name: str, num_blocks: int, **options: Any) -> Evictor:
    """Build the policy registered as `name` for a pool of `num_blocks` blocks."""
    try:
        factory = EVICTORS[name]
    except KeyError:
        known = ", ".join(sorted(EVICTORS))
        raise ValueError(f"unknown eviction policy {name!r}; known: {known}") from None
    return factory(num_blocks, **options)


__all__ = [
    "EVICTORS",
    "BeladyEvictor",
    "Evictor",
    "FIFOEvictor",
    "FreedBlocks",
    "FutureUses",
    "LFUEvictor",
    "LPCEvictor",
    "LRUEvictor",
    "Release",
    "check_probability",
    "decayed_probability",
    "make_evictor",
    "static_key",
]
