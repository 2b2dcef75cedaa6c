"""LPC as an SGLang 0.5.23 eviction strategy: `--radix-eviction-policy lpc`.

SGLang's radix cache evicts leaves in the order of `EvictionStrategy.get_priority(node)`, and
LPC's static key logit(p) + scale·t_last is such a sort key, so the whole policy is
`get_priority`: t_last is `node.last_access_time`, p the request's integer `priority` in parts
per million (0: no prediction), read only when `trust_request_priority` is set. `register()`
adds the factory to SGLang's `_EVICTION_POLICY_FACTORIES`.

How SGLang carries and pools p, bad priorities and trust: docs/design.md, "The SGLang
strategy".
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import threading
from typing import Any

from eviction.base import check_probability
from eviction.lpc import (
    DEFAULT_FALLBACK_PROBABILITY,
    DEFAULT_PROBABILITY_FLOOR,
    DEFAULT_SCALE_PER_S,
    static_key,
)

logger = logging.getLogger(__name__)

POLICY_NAME = "lpc"
SUPPORTED_SGLANG_VERSION = "0.5.23"
ALLOW_UNTESTED_VARIABLE = "LPC_SGLANG_ALLOW_UNTESTED"
PRIORITY_PER_UNIT = 1_000_000  # request priority = p in parts per million
_MIN_PRIORITY, _MAX_PRIORITY = 1, PRIORITY_PER_UNIT - 1


def probability_to_priority(probability: float) -> int:
    """The SGLang request `priority` that carries continuation probability p.

    p is rounded to parts per million and kept in [1, 999999] (LPC clamps p to
    [1e-6, 1 - 1e-6] anyway), so that it is never 0, SGLang's "no priority given".
    """
    check_probability(probability)
    return min(max(round(probability * PRIORITY_PER_UNIT), _MIN_PRIORITY), _MAX_PRIORITY)


def priority_to_probability(priority: Any) -> float | None:
    """The p a node's priority carries; None for "no prediction" (0 or unset) and for a
    priority that carries no p (not a number, NaN, ±inf, negative, above 1,000,000)."""
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int | float)
        or not 0 < priority <= PRIORITY_PER_UNIT  # NaN fails too
    ):
        return None
    # 1,000,000: SGLang bumps a checkpoint's prompt part by one over 999,999.
    return min(priority, _MAX_PRIORITY) / PRIORITY_PER_UNIT


class LPCStrategy:
    """SGLang eviction strategy: smallest logit(p) + scale·last_access_time first."""

    def __init__(
        self,
        scale_per_s: float = DEFAULT_SCALE_PER_S,
        fallback_probability: float = DEFAULT_FALLBACK_PROBABILITY,
        probability_floor: float = DEFAULT_PROBABILITY_FLOOR,
        trust_request_priority: bool = False,
    ) -> None:
        if not isinstance(trust_request_priority, bool):
            raise ValueError(
                f"lpc eviction policy: trust_request_priority must be true or false, "
                f"got {trust_request_priority!r}"
            )
        if (
            isinstance(scale_per_s, bool)
            or not isinstance(scale_per_s, int | float)
            or not math.isfinite(scale_per_s)
            or scale_per_s < 0
        ):
            raise ValueError(
                f"lpc eviction policy: scale_per_s must be a finite number >= 0, "
                f"got {scale_per_s!r}"
            )
        try:
            check_probability(fallback_probability, "fallback_probability")
        except ValueError as error:
            raise ValueError(f"lpc eviction policy: {error}") from None
        if not (isinstance(probability_floor, int | float) and 0 < probability_floor < 0.5):
            raise ValueError(
                f"lpc eviction policy: probability_floor must be in (0, 0.5), "
                f"got {probability_floor!r}"
            )
        self.scale_per_s = float(scale_per_s)
        self.fallback_probability = float(fallback_probability)
        self.probability_floor = float(probability_floor)
        self.trust_request_priority = trust_request_priority
        self.invalid_priorities = 0  # evaluations of a node whose priority carries no p
        self.untrusted_priorities = 0  # evaluations of a node whose p was not trusted

    def probability(self, node: Any) -> float:
        priority = node.priority
        p = priority_to_probability(priority)
        if p is not None:
            if self.trust_request_priority:
                return p
            self.untrusted_priorities += 1
            return self.fallback_probability
        if priority is not None and priority != 0:  # set, but no p in parts per million
            self.invalid_priorities += 1
            if self.invalid_priorities == 1:
                logger.warning(
                    "LPC strategy: a node's priority %.80r carries no probability (p in parts "
                    "per million, 1 to 1,000,000); the fallback p is used (counted in "
                    "invalid_priorities, logged once)",
                    priority,
                )
        return self.fallback_probability

    def get_priority(self, node: Any) -> float:
        return static_key(
            self.probability(node),
            node.last_access_time,
            self.scale_per_s,
            self.probability_floor,
        )


_REGISTERED = False
_LOCK = threading.Lock()


class IncompatibleSGLangError(RuntimeError):
    """The installed SGLang is not one the strategy can be registered into safely."""


def register() -> None:
    """Make `lpc` an SGLang radix eviction policy (the `sglang.srt.plugins` entry point).

    Idempotent. Process-wide state: SGLang's own registry and CLI choice list, which is what
    registering a policy means; `_REGISTERED` only avoids doing it twice.
    """
    global _REGISTERED
    with _LOCK:
        if _REGISTERED:
            return
        sglang = importlib.import_module("sglang")
        version = getattr(sglang, "__version__", "unknown")
        if version != SUPPORTED_SGLANG_VERSION and os.environ.get(ALLOW_UNTESTED_VARIABLE) != "1":
            raise IncompatibleSGLangError(
                f"SGLang {version} is installed; the LPC strategy is pinned to SGLang "
                f"{SUPPORTED_SGLANG_VERSION}. Install sglang=={SUPPORTED_SGLANG_VERSION} or set "
                f"{ALLOW_UNTESTED_VARIABLE}=1 to register it anyway."
            )
        evict_policy = importlib.import_module("sglang.srt.mem_cache.evict_policy")
        utils = importlib.import_module("sglang.srt.mem_cache.utils")
        choices = importlib.import_module("sglang.srt.arg_groups.choices")
        problems = []
        factories = getattr(utils, "_EVICTION_POLICY_FACTORIES", None)
        if not isinstance(factories, dict):
            problems.append("sglang.srt.mem_cache.utils has no _EVICTION_POLICY_FACTORIES dict")
        base = getattr(evict_policy, "EvictionStrategy", None)
        if base is None or "get_priority" not in getattr(base, "__abstractmethods__", ()):
            problems.append("sglang's EvictionStrategy no longer has an abstract get_priority")
        add_choices = getattr(choices, "add_radix_eviction_policy_choices", None)
        if add_choices is None or not hasattr(choices, "RADIX_EVICTION_POLICY_CHOICES"):
            problems.append("sglang no longer offers add_radix_eviction_policy_choices")
        if problems:
            raise IncompatibleSGLangError(
                f"cannot register the LPC strategy into SGLang {version}: " + "; ".join(problems)
            )
        assert factories is not None and base is not None and add_choices is not None
        base.register(LPCStrategy)  # a virtual subclass: isinstance checks hold
        factories.setdefault(POLICY_NAME, LPCStrategy)
        if POLICY_NAME not in choices.RADIX_EVICTION_POLICY_CHOICES:
            add_choices([POLICY_NAME])
        _REGISTERED = True
