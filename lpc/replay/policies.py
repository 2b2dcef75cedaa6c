"""What the A/B harness needs of a policy beyond its evictor: the probability or return-curve
source that feeds it and the settings it is built with.

Every name (`lru`, `lpc-turns`, `lpc-const=0.25`, `lpc-pooled(source=turns)`, `vllm-arc`) is
resolved by `eviction.registry.resolve_policy`; `PolicySpec` is a resolved name as the replay
reads it. The help text and error messages are built from the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eviction import POLICIES, Evictor, FutureUses, make_evictor, policy_names
from eviction.registry import (
    ALIASES,
    CPU_TIER_ONLY,
    PolicyParams,
    ResolvedPolicy,
    resolve_policy,
    split_policy_names,
)
from lpc.errors import InvalidInputError

HEURISTICS = policy_names("heuristic")
FITTED = policy_names("fitted")
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
    """The trace candidates whose evictor is registered (`eviction.POLICIES`)."""
    return tuple(name for name in TRACE_POLICY_CANDIDATES if _is_known(name))


def _is_known(name: str) -> bool:
    try:
        spec = parse_policy(name)
    except ValueError:
        return False
    return spec.evictor in POLICIES


# The registry's variant names by what they parameterise (the golden tests pin each one).
LPC_VARIANTS = tuple(n for n, a in ALIASES.items() if a.params.source is not None)
RETURN_VARIANTS = tuple(n for n, a in ALIASES.items() if a.params.curve is not None)


@dataclass(frozen=True)
class PolicySpec:
    """`label` names the run; `source` names the probability source LPC policies read,
    `curve_source` the return-curve source the `lpc-return` evictor reads."""

    label: str
    evictor: str
    source: str | None = None
    constant: float | None = None
    curve_source: str | None = None

    @property
    def resolved(self) -> ResolvedPolicy:
        params = PolicyParams(self.source, self.constant, self.curve_source)
        return ResolvedPolicy(self.label, self.evictor, params)

    @property
    def cpu_tier_only(self) -> bool:
        """A vLLM CPU-tier policy (`eviction.registry.CPU_TIER_ONLY`), not an evictor."""
        return self.resolved.cpu_tier_only

    @property
    def is_upper_bound(self) -> bool:
        return self.resolved.is_upper_bound


def policy_help() -> str:
    """`lpc ab --policies` help: the defaults, then every policy with its one-line summary."""
    heuristics = "; ".join(f"{n}: {POLICIES[n].description}" for n in HEURISTICS)
    fitted = "; ".join(f"{n}: {POLICIES[n].description}" for n in FITTED)
    bound = {n: resolve_policy(n).is_upper_bound for n in ALIASES}
    learned = "; ".join(
        f"{n}{'[=P]' if a.takes_p else ''}: {a.description}"
        for n, a in ALIASES.items()
        if not bound[n]
    )
    bounds = [f"{n}: {a.description}" for n, a in ALIASES.items() if bound[n]]
    bounds += [f"{n}: {POLICIES[n].description}" for n in policy_names("upper bound")]
    cpu_only = "; ".join(f"{n}: {p.description}" for n, p in CPU_TIER_ONLY.items())
    return (
        f"comma-separated policies (default: {','.join(DEFAULT_POLICIES)}, and lpc when a "
        "predictor model is available; on a --trace: "
        f"{','.join(TRACE_POLICY_CANDIDATES)}, with lpc and lpc-pooled before the upper bounds "
        "when an access-feature model is available (docs/training.md §8)). "
        f"Heuristics: {heuristics}. Heuristics with constants fitted on the training part "
        f"(reported under workload.fitted_policies in the JSON): {fitted}. Learned: {learned}. "
        f"Upper bounds (not deployable): {'; '.join(bounds)}. "
        f"For --offload-policies only: {cpu_only}"
    )


def parse_policy(text: str) -> PolicySpec:
    """The run a policy name asks for, resolved by the registry (`resolve_policy`)."""
    try:
        resolved = resolve_policy(text)
    except ValueError as error:
        raise InvalidInputError(str(error)) from None
    params = resolved.params
    return PolicySpec(resolved.label, resolved.policy, params.source, params.p, params.curve)


def parse_policies(text: str, cpu_tier: bool = False) -> list[PolicySpec]:
    """The policies of a comma-separated list; a CPU-tier-only one (`CPU_TIER_ONLY`) is
    refused unless `cpu_tier` (the list is `--offload-policies`)."""
    specs = [parse_policy(part) for part in split_policy_names(text)]
    if not specs:
        raise InvalidInputError("no policy given")
    if not cpu_tier:
        for spec in specs:
            refuse_in_gpu_tier(spec)
    labels = [spec.label for spec in specs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise InvalidInputError(f"policy listed twice: {', '.join(duplicates)}")
    return specs


def refuse_in_gpu_tier(spec: PolicySpec) -> None:
    """A CPU-tier-only policy cannot order the GPU prefix cache: say so, and what to use."""
    if spec.cpu_tier_only:
        policy = CPU_TIER_ONLY[spec.evictor]
        raise InvalidInputError(
            f"{spec.label} is vLLM's CPU offload tier policy, not a GPU prefix-cache evictor: "
            f"give it to --offload-policies; for the GPU tier use {policy.gpu_instead}"
        )


def build_evictor(
    spec: PolicySpec,
    num_blocks: int,
    scale_per_s: float,
    fallback_probability: float,
    future: FutureUses | None,
    options: Mapping[str, Any] | None = None,
) -> Evictor:
    """The spec's evictor; a fitted policy gets its fitted `options` (defaults without). A
    CPU-tier-only policy has none (`refuse_in_gpu_tier`)."""
    refuse_in_gpu_tier(spec)
    return make_evictor(
        spec.evictor,
        num_blocks,
        **evictor_options(spec, scale_per_s, fallback_probability, future, options),
    )


def evictor_options(
    spec: PolicySpec,
    scale_per_s: float,
    fallback_probability: float,
    future: FutureUses | None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The settings `build_evictor` builds the spec's evictor with; the replay's CPU tier
    hands the same ones to the vLLM `CachePolicy` that builds its own evictor
    (`lpc.replay.cache_policy_tier`). A CPU-tier-only policy takes none."""
    if spec.cpu_tier_only:
        return {}
    kind = POLICIES[spec.evictor].kind
    if kind == "fitted":
        return dict(options or {})
    if spec.curve_source is not None:  # its own constants (eviction/return_window.py)
        return {}
    if kind == "learned":
        return {"scale_per_s": scale_per_s, "fallback_probability": fallback_probability}
    if kind == "upper bound":
        if future is None:
            raise ValueError(f"{spec.evictor} needs the whole trace's future (an open-loop replay)")
        return {"future": future}
    return {}
