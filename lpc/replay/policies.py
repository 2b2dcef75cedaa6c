"""Named policies for the A/B harness: an evictor plus, for LPC, a probability source.

Every eviction policy in `eviction.registry` is selectable by its name. LPC, the learned one,
is named by the probability source that feeds it (`LPC_VARIANTS`): lpc (the learned
predictor), lpc-turns (the turns-only ablation), lpc-const[=P] (one constant p, a sanity
check that should track lru), lpc-trace (a trace's logged p) and oracle (the true label, an
upper bound); lpc-pooled is the learned predictor driving the `lpc-pooled` evictor (OR
pooling and a shared-prefix floor, `eviction.lpc_pooled`). The `lpc-return` evictor, which
asks when a conversation comes back, is named by the return-curve source that feeds it
(`RETURN_VARIANTS`). `vllm-arc` is vLLM's own ARC for its CPU offload tier, no evictor: the
two-tier replay's CPU tier runs its class (`CPU_TIER_POLICIES`), and the GPU tier refuses it.
The help text and error messages are built from these tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eviction import POLICIES, Evictor, FutureUses, make_evictor, policy_names
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


@dataclass(frozen=True)
class LPCVariant:
    """An LPC evictor fed one probability source; `upper_bound` when the source is not
    deployable. `evictor` names the learned evictor in `eviction.POLICIES`."""

    name: str
    source: str
    description: str
    upper_bound: bool = False
    evictor: str = "lpc"


LPC_VARIANTS: dict[str, LPCVariant] = {
    v.name: v
    for v in (
        LPCVariant("lpc", "model", "LPC with the learned predictor (--model)"),
        LPCVariant(
            "lpc-pooled",
            "model",
            "the learned predictor with OR pooling across conversations and an online "
            "floor for prefixes shared across them (eviction/lpc_pooled.py)",
            evictor="lpc-pooled",
        ),
        LPCVariant(
            "lpc-turns", "turns", "LPC with the turns-only ablation fitted on the training half"
        ),
        LPCVariant("lpc-const", "const", "LPC with one constant p (lpc-const=P, default 0.5)"),
        LPCVariant("lpc-trace", "trace", "LPC with the 'probability' logged in a --trace"),
        LPCVariant("oracle", "oracle", "LPC with the true label", upper_bound=True),
    )
}


@dataclass(frozen=True)
class ReturnVariant:
    """The `lpc-return` evictor fed one return-curve source (`lpc.replay.return_sources`)."""

    name: str
    curve_source: str
    description: str
    upper_bound: bool = False
    evictor: str = "lpc-return"


RETURN_VARIANTS: dict[str, ReturnVariant] = {
    v.name: v
    for v in (
        ReturnVariant(
            "lpc-return-km",
            "km-turn",
            "P(return within its own eviction age | silent a) from Kaplan–Meier return curves "
            "per turn, fitted on the training part (eviction/return_window.py)",
        ),
        ReturnVariant(
            "lpc-return-model",
            "model",
            "the same evictor fed the return-time hazard model's curve per release, from the "
            "access features an engine knows at the release (--return-model)",
        ),
        ReturnVariant(
            "lpc-return-true",
            "true-return",
            "the same evictor fed each conversation's true next arrival (a step curve)",
            upper_bound=True,
        ),
    )
}


@dataclass(frozen=True)
class CpuTierPolicy:
    """A policy of vLLM's CPU offload tier that is no evictor of `eviction.POLICIES`: the
    two-tier replay's CPU tier runs its vLLM class itself (`cache_policy_tier.VLLM_POLICIES`),
    and it has no place in the GPU tier (`gpu_instead` is the nearest GPU-tier policy)."""

    name: str
    description: str
    gpu_instead: str


CPU_TIER_POLICIES: dict[str, CpuTierPolicy] = {
    p.name: p
    for p in (
        CpuTierPolicy(
            "vllm-arc",
            "vLLM 0.33's own ARC for its CPU offload tier (ARCCachePolicy, transcribed in "
            "lpc/replay/vllm_arc_policy.py), run as CPUOffloadingManager runs it; CPU tier only "
            "(arc is FAST'03 ARC)",
            gpu_instead="arc (FAST'03 ARC)",
        ),
    )
}


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
    def cpu_tier_only(self) -> bool:
        """A vLLM CPU-tier policy (`CPU_TIER_POLICIES`), not an evictor."""
        return self.evictor in CPU_TIER_POLICIES

    @property
    def is_upper_bound(self) -> bool:
        if self.cpu_tier_only:
            return False
        variant = LPC_VARIANTS.get(self.label.partition("=")[0])
        if variant is not None:
            return variant.upper_bound
        if self.label in RETURN_VARIANTS:
            return RETURN_VARIANTS[self.label].upper_bound
        return POLICIES[self.evictor].kind == "upper bound"


def selectable_names() -> list[str]:
    """Every name `parse_policy` accepts, as a user would type it."""
    names = [name for name, entry in POLICIES.items() if entry.kind != "learned"]
    names += [f"{name}[=P]" if v.source == "const" else name for name, v in LPC_VARIANTS.items()]
    names += list(RETURN_VARIANTS)
    names += list(CPU_TIER_POLICIES)
    return names


def policy_help() -> str:
    """`lpc ab --policies` help: the defaults, then every policy with its one-line summary."""
    heuristics = "; ".join(f"{n}: {POLICIES[n].description}" for n in HEURISTICS)
    fitted = "; ".join(f"{n}: {POLICIES[n].description}" for n in FITTED)
    learned = "; ".join(
        f"{'lpc-const[=P]' if v.source == 'const' else n}: {v.description}"
        for n, v in LPC_VARIANTS.items()
        if not v.upper_bound
    )
    learned += "".join(
        f"; {n}: {v.description}" for n, v in RETURN_VARIANTS.items() if not v.upper_bound
    )
    bounds = [f"{n}: {v.description}" for n, v in LPC_VARIANTS.items() if v.upper_bound]
    bounds += [f"{n}: {v.description}" for n, v in RETURN_VARIANTS.items() if v.upper_bound]
    bounds += [f"{n}: {POLICIES[n].description}" for n in policy_names("upper bound")]
    cpu_only = "; ".join(f"{n}: {p.description}" for n, p in CPU_TIER_POLICIES.items())
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
    name = text.strip()
    entry = POLICIES.get(name)
    if entry is not None and entry.kind != "learned":
        return PolicySpec(name, name)
    returning = RETURN_VARIANTS.get(name)
    if returning is not None:
        return PolicySpec(name, returning.evictor, curve_source=returning.curve_source)
    if name in CPU_TIER_POLICIES:
        return PolicySpec(name, name)
    base, has_value, value = name.partition("=")
    variant = LPC_VARIANTS.get(base)
    if variant is not None and (not has_value or variant.source == "const"):
        if variant.source != "const":
            return PolicySpec(name, variant.evictor, variant.source)
        value = value or "0.5"
        try:
            p = float(value)
        except ValueError:
            raise InvalidInputError(f"policy {name!r}: {value!r} is not a number") from None
        if not 0.0 <= p <= 1.0:
            raise InvalidInputError(f"policy {name!r}: p must be in [0, 1]")
        return PolicySpec(name, variant.evictor, "const", p)
    raise InvalidInputError(f"unknown policy {name!r}; choose from {', '.join(selectable_names())}")


def parse_policies(text: str, cpu_tier: bool = False) -> list[PolicySpec]:
    """The policies of a comma-separated list; a CPU-tier-only one (`CPU_TIER_POLICIES`) is
    refused unless `cpu_tier` (the list is `--offload-policies`)."""
    specs = [parse_policy(part) for part in text.split(",") if part.strip()]
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
        policy = CPU_TIER_POLICIES[spec.evictor]
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
