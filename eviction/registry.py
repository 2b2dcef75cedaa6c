"""The one list of policies: adding a policy is its file plus one entry here.

Every name a user can give a policy is resolved here (`resolve_policy`): an evictor of
`POLICIES`, the same with parameters (`lpc(source=turns)`), a named variant (`ALIASES`:
`lpc-turns` is `lpc(source=turns)`), or a policy of vLLM's CPU offload tier that is no evictor
(`CPU_TIER_ONLY`). `make_evictor`, `lpc ab --policies` (parsing and its help text), `lpc bench
evictor --policies` and the contract tests all read these; nothing writes them.
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


@dataclass(frozen=True)
class PolicyParams:
    """What feeds a learned evictor beyond the pool size. `source`: where an LPC evictor's
    probabilities come from (the replay's sources: model, turns, const, trace, oracle);
    `p`: the constant of source=const; `curve`: where `lpc-return` reads its return curves
    (km-turn, model, true-return)."""

    source: str | None = None
    p: float | None = None
    curve: str | None = None


# The values each parameter takes, per evictor; an evictor absent here takes none.
PARAMETERS: dict[str, dict[str, tuple[str, ...]]] = {
    "lpc": {"source": ("model", "turns", "const", "trace", "oracle")},
    "lpc-pooled": {"source": ("model", "turns", "const", "trace", "oracle")},
    "lpc-return": {"curve": ("km-turn", "model", "true-return")},
}
# Sources no deployment has: they make any policy fed by them an upper bound.
UPPER_BOUND_SOURCES = frozenset({"oracle", "true-return"})


@dataclass(frozen=True)
class PolicyAlias:
    """A name for an evictor with fixed parameters, kept as users know it (reports label a
    run by the name it was given). `takes_p`: the name accepts `=P` (`lpc-const=0.25`)."""

    name: str
    policy: str
    params: PolicyParams
    description: str
    takes_p: bool = False


ALIASES: dict[str, PolicyAlias] = {
    alias.name: alias
    for alias in (
        PolicyAlias(
            "lpc", "lpc", PolicyParams("model"), "LPC with the learned predictor (--model)"
        ),
        PolicyAlias(
            "lpc-pooled",
            "lpc-pooled",
            PolicyParams("model"),
            "the learned predictor with OR pooling across conversations and an online "
            "floor for prefixes shared across them (eviction/lpc_pooled.py)",
        ),
        PolicyAlias(
            "lpc-turns",
            "lpc",
            PolicyParams("turns"),
            "LPC with the turns-only ablation fitted on the training half",
        ),
        PolicyAlias(
            "lpc-const",
            "lpc",
            PolicyParams("const", 0.5),
            "LPC with one constant p (lpc-const=P, default 0.5)",
            takes_p=True,
        ),
        PolicyAlias(
            "lpc-trace",
            "lpc",
            PolicyParams("trace"),
            "LPC with the 'probability' logged in a --trace",
        ),
        PolicyAlias("oracle", "lpc", PolicyParams("oracle"), "LPC with the true label"),
        PolicyAlias(
            "lpc-return-km",
            "lpc-return",
            PolicyParams(curve="km-turn"),
            "P(return within its own eviction age | silent a) from Kaplan–Meier return curves "
            "per turn, fitted on the training part (eviction/return_window.py)",
        ),
        PolicyAlias(
            "lpc-return-model",
            "lpc-return",
            PolicyParams(curve="model"),
            "the same evictor fed the return-time hazard model's curve per release, from the "
            "access features an engine knows at the release (--return-model)",
        ),
        PolicyAlias(
            "lpc-return-true",
            "lpc-return",
            PolicyParams(curve="true-return"),
            "the same evictor fed each conversation's true next arrival (a step curve)",
        ),
    )
}


@dataclass(frozen=True)
class CpuTierEntry:
    """A policy of vLLM's CPU offload tier that is no evictor: the engine's own class runs it
    in that tier, and it has no place in the GPU tier (`gpu_instead` is the nearest one)."""

    name: str
    description: str
    gpu_instead: str


CPU_TIER_ONLY: dict[str, CpuTierEntry] = {
    entry.name: entry
    for entry in (
        CpuTierEntry(
            "vllm-arc",
            "vLLM 0.33's own ARC for its CPU offload tier (ARCCachePolicy, transcribed in "
            "lpc/replay/vllm_arc_policy.py), run as CPUOffloadingManager runs it; CPU tier only "
            "(arc is FAST'03 ARC)",
            gpu_instead="arc (FAST'03 ARC)",
        ),
    )
}


@dataclass(frozen=True)
class ResolvedPolicy:
    """A name resolved: the run's `label` (the name as given, or the alias a parameterised
    name equals), the registry entry it runs (`policy`) and its parameters."""

    label: str
    policy: str
    params: PolicyParams

    @property
    def cpu_tier_only(self) -> bool:
        return self.policy in CPU_TIER_ONLY

    @property
    def is_upper_bound(self) -> bool:
        if self.cpu_tier_only:
            return False
        fed_by = {self.params.source, self.params.curve}
        return bool(fed_by & UPPER_BOUND_SOURCES) or POLICIES[self.policy].kind == "upper bound"


def selectable_names() -> list[str]:
    """Every plain name `resolve_policy` accepts, as a user would type it."""
    names = [name for name, entry in POLICIES.items() if entry.kind != "learned"]
    names += [f"{name}[=P]" if alias.takes_p else name for name, alias in ALIASES.items()]
    names += list(CPU_TIER_ONLY)
    return names


def _unknown(name: str) -> ValueError:
    return ValueError(
        f"unknown policy {name!r}; choose from {', '.join(selectable_names())} "
        "(or a learned evictor with parameters, e.g. lpc(source=turns))"
    )


def _constant(name: str, value: str) -> float:
    try:
        p = float(value)
    except ValueError:
        raise ValueError(f"policy {name!r}: {value!r} is not a number") from None
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"policy {name!r}: p must be in [0, 1]")
    return p


def _with_parameters(name: str, policy: str, inside: str) -> ResolvedPolicy:
    """`policy(k=v,...)`: each parameter once, each value one the evictor takes; the label
    is the alias with the same parameters when there is one."""
    allowed = PARAMETERS.get(policy)
    if allowed is None:
        raise ValueError(f"policy {name!r}: {policy} takes no parameters")
    given: dict[str, str] = {}
    for part in inside.split(","):
        key, has_value, value = (x.strip() for x in part.partition("="))
        if not has_value or not value:
            raise ValueError(f"policy {name!r}: {part.strip()!r} is not key=value")
        if key in given:
            raise ValueError(f"policy {name!r}: {key} given twice")
        given[key] = value
    p = given.pop("p", None)
    for key, value in given.items():
        if key not in allowed:
            known = ", ".join([*allowed, "p"] if "source" in allowed else allowed)
            raise ValueError(f"policy {name!r}: {policy} has no parameter {key!r}; it has {known}")
        if value not in allowed[key]:
            raise ValueError(
                f"policy {name!r}: {key} must be one of {', '.join(allowed[key])}, got {value!r}"
            )
    missing = [key for key in allowed if key not in given]
    if missing:
        raise ValueError(f"policy {name!r}: {policy} needs {', '.join(missing)}")
    if (p is not None) != (given.get("source") == "const"):
        raise ValueError(f"policy {name!r}: p goes with source=const, and source=const needs p")
    params = PolicyParams(
        given.get("source"), _constant(name, p) if p else None, given.get("curve")
    )
    for alias in ALIASES.values():
        if alias.policy == policy and alias.params == params:
            return ResolvedPolicy(alias.name, policy, params)
        if alias.policy == policy and alias.takes_p and alias.params.source == params.source:
            return ResolvedPolicy(f"{alias.name}={p}", policy, params)
    return ResolvedPolicy(name, policy, params)


def resolve_policy(text: str) -> ResolvedPolicy:
    """The policy a user's name means: a non-learned evictor's name, an alias (`lpc-turns`,
    `lpc-const=0.25`), a CPU-tier-only policy, or an evictor with parameters
    (`lpc-pooled(source=turns)`). ValueError, naming the choices, for anything else."""
    name = text.strip()
    entry = POLICIES.get(name)
    if entry is not None and entry.kind != "learned":
        return ResolvedPolicy(name, name, PolicyParams())
    if name in CPU_TIER_ONLY:
        return ResolvedPolicy(name, name, PolicyParams())
    base, paren, rest = name.partition("(")
    if paren:
        if not rest.endswith(")") or base.strip() not in POLICIES:
            raise _unknown(name)
        return _with_parameters(name, base.strip(), rest[:-1])
    base, has_value, value = name.partition("=")
    alias = ALIASES.get(base)
    if alias is None or (has_value and not alias.takes_p):
        raise _unknown(name)
    if has_value or alias.takes_p:
        params = PolicyParams(alias.params.source, _constant(name, value or "0.5"))
        return ResolvedPolicy(name, alias.policy, params)
    return ResolvedPolicy(name, alias.policy, alias.params)


def split_policy_names(text: str) -> list[str]:
    """A comma-separated list of names, commas inside parentheses kept: `lru,lpc(source=
    const,p=0.3)` is two names. Empty parts are dropped."""
    names, depth, start = [], 0, 0
    for at, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            names.append(text[start:at])
            start = at + 1
    names.append(text[start:])
    return [name.strip() for name in names if name.strip()]


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
