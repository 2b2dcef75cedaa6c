"""The one list of eviction policies: adding a policy is its file plus one entry here.

Everything that selects a policy by name reads `POLICIES`: `make_evictor`, `lpc ab
--policies` (parsing and its help text), `lpc bench evictor --policies` and the tests that
run every policy through the evictor contract and the block manager's invariants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from eviction.arc import ARCEvictor
from eviction.base import Evictor
from eviction.belady import BeladyEvictor
from eviction.fifo import FIFOEvictor
from eviction.lfu import LFUEvictor
from eviction.lhd import LHDEvictor
from eviction.libcachesim_caches import LRBEvictor, ThreeLCacheEvictor
from eviction.lpc import LPCEvictor
from eviction.lpc_pooled import PooledLPCEvictor
from eviction.lru import LRUEvictor
from eviction.return_window import ReturnWindowEvictor
from eviction.s3fifo import S3FIFOEvictor
from eviction.sae import SAEEvictor
from eviction.session_ref import SessionRefEvictor
from eviction.sglang_tlru import SGLangTLRUEvictor
from eviction.sieve import SieveEvictor
from eviction.tlru import TLRUEvictor
from eviction.wa import WAEvictor

PolicyKind = Literal["heuristic", "fitted", "learned", "upper bound"]


@dataclass(frozen=True)
class PolicyEntry:
    """A policy's name, how to build it, what it does in one line, and what kind it is.

    `kind` tells callers what a policy needs: a heuristic is built from the pool size alone;
    a fitted one too, but takes constants fitted on a training part as options (the replay
    fits them: `lpc.replay.fitted_policies`; without them it runs on documented defaults); a
    learned policy reads predicted probabilities from its releases; an upper bound needs
    knowledge no deployment has (belady: the trace's future, passed as `future=`).
    """

    name: str
    factory: Callable[..., Evictor]
    description: str
    kind: PolicyKind


POLICIES: dict[str, PolicyEntry] = {
    entry.name: entry
    for entry in (
        PolicyEntry("lru", LRUEvictor, "least recently released first (vLLM's queue)", "heuristic"),
        PolicyEntry(
            "fifo", FIFOEvictor, "first cached first, hits ignored (Dynamo's)", "heuristic"
        ),
        PolicyEntry("lfu", LFUEvictor, "fewest releases first, ties by recency", "heuristic"),
        PolicyEntry(
            "s3fifo", S3FIFOEvictor, "small + main FIFO with a ghost queue (SOSP'23)", "heuristic"
        ),
        PolicyEntry(
            "sieve", SieveEvictor, "FIFO with a visited bit and a hand (NSDI'24)", "heuristic"
        ),
        PolicyEntry("arc", ARCEvictor, "adaptive recency/frequency split (FAST'03)", "heuristic"),
        PolicyEntry(
            "lhd", LHDEvictor, "least hit density, by age and hit-age class (NSDI'18)", "heuristic"
        ),
        PolicyEntry(
            "lrb",
            LRBEvictor,
            "learned online: farthest predicted next release among sampled blocks "
            "(NSDI'20, libCacheSim; needs lpc[rivals])",
            "heuristic",
        ),
        PolicyEntry(
            "3l-cache",
            ThreeLCacheEvictor,
            "learned online, LRB's idea at lower cost (FAST'25, libCacheSim; needs lpc[rivals])",
            "heuristic",
        ),
        PolicyEntry(
            "sae",
            SAEEvictor,
            "worst session first, tail first (vLLM PR #50422, CPU offload tier)",
            "heuristic",
        ),
        PolicyEntry(
            "wa",
            WAEvictor,
            "one LRU queue per request type x turn, evict the head least likely reused soon "
            "(ATC'25, vLLM PR #22236)",
            "fitted",
        ),
        PolicyEntry(
            "session-ref",
            SessionRefEvictor,
            "a live session's latest chain outranks unreferenced blocks until an idle "
            "timeout (SGLang session references)",
            "fitted",
        ),
        PolicyEntry(
            "tlru",
            TLRUEvictor,
            "tail-optimized LRU: a chain's blocks past the next turn's TTFT budget first, then "
            "LRU (NeurIPS'25)",
            "fitted",
        ),
        PolicyEntry(
            "sglang-tlru",
            SGLangTLRUEvictor,
            "T-LRU with each block's high-water chain length (SGLang's tlru)",
            "fitted",
        ),
        PolicyEntry(
            "lpc", LPCEvictor, "least likely to be continued first, by predicted p", "learned"
        ),
        PolicyEntry(
            "lpc-pooled",
            PooledLPCEvictor,
            "lpc with OR pooling and an online floor for prefixes shared across conversations",
            "learned",
        ),
        PolicyEntry(
            "lpc-return",
            ReturnWindowEvictor,
            "least likely to return within its own eviction age first, by a return curve",
            "learned",
        ),
        PolicyEntry(
            "belady", BeladyEvictor, "farthest next use first (needs the future)", "upper bound"
        ),
    )
}


def policy_names(kind: PolicyKind | None = None) -> tuple[str, ...]:
    """Registered names in registry order, optionally only those of one kind."""
    return tuple(name for name, entry in POLICIES.items() if kind is None or entry.kind == kind)


def make_evictor(name: str, num_blocks: int, **options: Any) -> Evictor:
    """Build the policy registered as `name` for a pool of `num_blocks` blocks."""
    try:
        entry = POLICIES[name]
    except KeyError:
        known = ", ".join(POLICIES)
        raise ValueError(f"unknown eviction policy {name!r}; known: {known}") from None
    return entry.factory(num_blocks, **options)
