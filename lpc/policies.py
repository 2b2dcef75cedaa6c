"""Named policies for the A/B harness: an evictor plus, for LPC, a probability source.

lru, fifo, lfu      the heuristics (lru is vLLM's)
lpc-turns           LPC fed the turns-only ablation
lpc-const[=P]       LPC with one constant p (a sanity check: it should track lru)
lpc                 LPC fed the learned predictor
oracle              LPC fed the true label (upper bound, not deployable)
belady              evict the block used farthest in the future (upper bound)
"""

from __future__ import annotations

from dataclasses import dataclass

from eviction import EVICTORS, Evictor, FutureUses, make_evictor
from lpc.errors import InvalidInputError

HEURISTICS = ("lru", "fifo", "lfu")
# Evictors that need a probability source or the future are not plain heuristics.
_NOT_HEURISTICS = ("lpc", "belady")
DEFAULT_POLICIES = ("lru", "fifo", "lfu", "lpc-turns", "oracle", "belady")
# With a trained predictor at hand (the shipped model or --model), learned LPC joins them.
DEFAULT_POLICIES_WITH_MODEL = ("lru", "fifo", "lfu", "lpc-turns", "lpc", "oracle", "belady")


# On a request trace (no text, so no learned predictor): every heuristic the evictor registry
# holds, LPC with turns and with a constant p, and both upper bounds.
TRACE_POLICY_CANDIDATES = (
    "lru",
    "fifo",
    "lfu",
    "s3fifo",
    "sieve",
    "arc",
    "lpc-turns",
    "lpc-const",
    "oracle",
    "belady",
)


def default_policies(model_available: bool) -> tuple[str, ...]:
    return DEFAULT_POLICIES_WITH_MODEL if model_available else DEFAULT_POLICIES


def default_trace_policies() -> tuple[str, ...]:
    """The trace candidates whose evictor is registered (`eviction.EVICTORS`)."""
    return tuple(name for name in TRACE_POLICY_CANDIDATES if _is_known(name))


def _is_known(name: str) -> bool:
    try:
        spec = parse_policy(name)
    except ValueError:
        return False
    return spec.evictor in EVICTORS


@dataclass(frozen=True)
class PolicySpec:
    """`label` names the run; `source` names the probability source LPC policies read."""

    label: str
    evictor: str
    source: str | None = None
    constant: float | None = None

    @property
    def is_upper_bound(self) -> bool:
        return self.label in ("oracle", "belady")


def parse_policy(text: str) -> PolicySpec:
    name = text.strip()
    if name in HEURISTICS or (name in EVICTORS and name not in _NOT_HEURISTICS):
        return PolicySpec(name, name)
    if name == "belady":
        return PolicySpec(name, "belady")
    if name == "oracle":
        return PolicySpec(name, "lpc", "oracle")
    if name == "lpc":
        return PolicySpec(name, "lpc", "model")
    if name == "lpc-turns":
        return PolicySpec(name, "lpc", "turns")
    if name == "lpc-trace":
        return PolicySpec(name, "lpc", "trace")
    if name == "lpc-const" or name.startswith("lpc-const="):
        value = name.partition("=")[2] or "0.5"
        try:
            p = float(value)
        except ValueError:
            raise InvalidInputError(f"policy {name!r}: {value!r} is not a number") from None
        if not 0.0 <= p <= 1.0:
            raise InvalidInputError(f"policy {name!r}: p must be in [0, 1]")
        return PolicySpec(name, "lpc", "const", p)
    raise InvalidInputError(
        f"unknown policy {name!r}; choose from lru, fifo, lfu, lpc, lpc-turns, lpc-const[=P], "
        "lpc-trace, oracle, belady"
    )


def parse_policies(text: str) -> list[PolicySpec]:
    specs = [parse_policy(part) for part in text.split(",") if part.strip()]
    if not specs:
        raise InvalidInputError("no policy given")
    labels = [spec.label for spec in specs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise InvalidInputError(f"policy listed twice: {', '.join(duplicates)}")
    return specs


def build_evictor(
    spec: PolicySpec,
    num_blocks: int,
    scale_per_s: float,
    fallback_probability: float,
    future: FutureUses | None,
) -> Evictor:
    if spec.evictor == "lpc":
        return make_evictor(
            "lpc", num_blocks, scale_per_s=scale_per_s, fallback_probability=fallback_probability
        )
    if spec.evictor == "belady":
        if future is None:
            raise ValueError("belady needs the whole trace's future (an open-loop replay)")
        return make_evictor("belady", num_blocks, future=future)
    return make_evictor(spec.evictor, num_blocks)
