"""What LPC needs beyond an operation stream: each request's probability and conversation,
and the time of every step. Shared by our replays and the vLLM plugin driver.

`lpc.difftest` streams say what requests arrive and leave; LPC's order also depends on *when*
a request releases its blocks, with which continuation probability, and for which
conversation. A `ReleasePlan` carries that, per stream, as JSON beside the stream file. The
vLLM driver (`scripts/vllm_plugin_replay.py`) sends each request's probability and
conversation id to the plugin in `SamplingParams.extra_args`, exactly as an API layer would,
and drives the plugin's clock with the plan's times; our replays pass the same values to
`PrefixCacheBlockManager`. Standard library only: the driver imports this in vLLM's venv.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eviction.lpc_pooled import DEFAULT_MEMORY
from lpc.difftest.ops import NewRequest, Stream
from lpc.integrations.request_hints import CONVERSATION_KEY, PROBABILITY_KEY, USER_PROMPTS_KEY


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """A request's continuation probability (None: predict it, or the fallback), conversation
    id, and the user prompts a predictor would be asked about."""

    probability: float | None = None
    conversation_id: str | None = None
    user_prompts: tuple[str, ...] = ()

    def extra_args(self) -> dict[str, Any]:
        """The request's `SamplingParams.extra_args`, as an API layer would set them."""
        out: dict[str, Any] = {}
        if self.probability is not None:
            out[PROBABILITY_KEY] = self.probability
        if self.conversation_id is not None:
            out[CONVERSATION_KEY] = self.conversation_id
        if self.user_prompts:
            out[USER_PROMPTS_KEY] = list(self.user_prompts)
        return out


@dataclass
class ReleasePlan:
    """Per-request plans and per-step times (step k of the stream happens at `times[k - 1]`).

    Without `times` step k happens at time k, which is strictly increasing: two releases
    never tie, so LPC with one constant p orders blocks exactly by release, as LRU does.
    """

    requests: dict[str, RequestPlan] = field(default_factory=dict)
    times: list[float] | None = None

    def request(self, request_id: str) -> RequestPlan:
        return self.requests.get(request_id, _NO_PLAN)

    def time_of(self, step: int) -> float:
        return float(step) if self.times is None else self.times[step - 1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": {
                rid: {
                    "probability": r.probability,
                    "conversation_id": r.conversation_id,
                    "user_prompts": list(r.user_prompts),
                }
                for rid, r in self.requests.items()
            },
            "times": self.times,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReleasePlan:
        requests = {
            str(rid): RequestPlan(
                _probability(r.get("probability"), rid),
                r.get("conversation_id"),
                tuple(r.get("user_prompts", ())),
            )
            for rid, r in data.get("requests", {}).items()
        }
        times = data.get("times")
        if times is not None:
            times = [float(t) for t in times]
            if any(not math.isfinite(t) for t in times):
                raise ValueError("plan times must be finite")
        return cls(requests, times)


_NO_PLAN = RequestPlan()


def _probability(value: Any, rid: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"request {rid}: probability must be in [0, 1] or null, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PluginSettings:
    """The LPC_* settings a comparison gives the plugin (`lpc vllm-ab`'s flags): both sides of
    a comparison use the decay scale and the fallback p."""

    scale_per_s: float = 1e-2
    fallback_probability: float = 0.5
    access_model: Path | None = None  # LPC_ACCESS_MODEL
    conversation_table_max_tokens: int | None = None  # LPC_CONVERSATION_TABLE_MAX_TOKENS
    return_model: Path | None = None  # lpc-return's curves (LPC_RETURN_MODEL)
    pooled_memory: str = DEFAULT_MEMORY  # lpc-pooled's (LPC_POOLED_MEMORY)


def write_plans(
    path: Any, plans: Mapping[str, ReleasePlan], settings: PluginSettings | None = None
) -> None:
    """Write the plans of several streams (keyed by stream name) as one JSON file, with the
    scale and fallback p; the plugin driver takes its models as flags, not from this file."""
    settings = settings if settings is not None else PluginSettings()
    if settings != PluginSettings(settings.scale_per_s, settings.fallback_probability):
        raise ValueError("a plan file carries the scale and fallback p only; pass models as flags")
    document = {
        "settings": {
            "scale_per_s": settings.scale_per_s,
            "fallback_probability": settings.fallback_probability,
        },
        "streams": {name: plan.to_dict() for name, plan in plans.items()},
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle)


def read_plans(path: Any) -> tuple[dict[str, ReleasePlan], PluginSettings]:
    with open(path, encoding="utf-8") as handle:
        document = json.load(handle)
    settings = PluginSettings(**document.get("settings", {}))
    plans = {name: ReleasePlan.from_dict(p) for name, p in document.get("streams", {}).items()}
    return plans, settings


def random_plan(
    stream: Stream,
    seed: int,
    probabilities: Sequence[float | None] = (0.05, 0.2, 0.5, 0.8, 0.95, None),
    num_conversations: int = 8,
) -> ReleasePlan:
    """Per-request probabilities and conversation ids drawn from a seed.

    Few conversations, so that blocks are often released again by their own conversation
    (the new key replaces the old) and often shared across conversations (max pooling); a
    `None` probability exercises the fallback.
    """
    rng = random.Random(f"lpc-release-plan-{seed}")
    plan = ReleasePlan()
    for op in stream.ops:
        if isinstance(op, NewRequest):
            plan.requests[op.request_id] = RequestPlan(
                rng.choice(probabilities), f"conv-{rng.randrange(num_conversations)}"
            )
    return plan


def constant_plan(
    stream: Stream, probability: float | None, seed: int, with_prompts: bool = False
) -> ReleasePlan:
    """One probability for every request; conversation ids still vary, from the seed.

    With `with_prompts` each request also carries user prompts, so that a plugin with a
    predictor asks for its prediction (a None probability then means "predict it").
    """
    rng = random.Random(f"lpc-constant-plan-{seed}")
    plan = ReleasePlan()
    for op in stream.ops:
        if isinstance(op, NewRequest):
            conversation = f"conv-{rng.randrange(8)}"
            prompts = (f"a question of {conversation} in {op.request_id}",) if with_prompts else ()
            plan.requests[op.request_id] = RequestPlan(probability, conversation, prompts)
    return plan
