"""Eviction policies for a prefix-caching block manager (pure Python, no other dependencies).

`make_evictor(name, num_blocks, **options)` builds any registered policy; see `base.Evictor`
for the contract a block manager relies on.
"""

from __future__ import annotations

from collections.abc import Callable

from eviction.arc import ARCEvictor
from eviction.base import Evictor, FreedBlocks, Release, ReturnCurveLike, check_probability
from eviction.belady import BeladyEvictor, FutureUses
from eviction.fifo import FIFOEvictor
from eviction.lfu import LFUEvictor
from eviction.lhd import LHDEvictor
from eviction.lpc import LPCEvictor, decayed_probability, static_key
from eviction.lpc_pooled import PooledLPCEvictor
from eviction.lru import LRUEvictor
from eviction.registry import POLICIES, PolicyEntry, make_evictor, policy_names
from eviction.return_window import ReturnWindowEvictor
from eviction.s3fifo import S3FIFOEvictor
from eviction.sae import SAEEvictor
from eviction.session_ref import SessionRefEvictor
from eviction.sieve import SieveEvictor
from eviction.wa import WAEvictor

# Name -> factory, read from the registry (kept for callers that only build evictors).
EVICTORS: dict[str, Callable[..., Evictor]] = {name: e.factory for name, e in POLICIES.items()}


__all__ = [
    "EVICTORS",
    "POLICIES",
    "ARCEvictor",
    "BeladyEvictor",
    "Evictor",
    "FIFOEvictor",
    "FreedBlocks",
    "FutureUses",
    "LFUEvictor",
    "LHDEvictor",
    "LPCEvictor",
    "LRUEvictor",
    "PolicyEntry",
    "PooledLPCEvictor",
    "Release",
    "ReturnCurveLike",
    "ReturnWindowEvictor",
    "S3FIFOEvictor",
    "SAEEvictor",
    "SessionRefEvictor",
    "SieveEvictor",
    "WAEvictor",
    "check_probability",
    "decayed_probability",
    "make_evictor",
    "policy_names",
    "static_key",
]
