"""LPC as an SGLang 0.5.23 eviction strategy: `--radix-eviction-policy lpc`.

SGLang's radix cache evicts leaves in the order of `EvictionStrategy.get_priority(node)`, and
LPC's static key logit(p) + scale·t_last is such a sort key, so the whole policy is
`get_priority`: t_last is `node.last_access_time`, p the request's integer `priority` in parts
per million (0: no prediction), read only when `trust_request_priority` is set. `register()`
adds the factory to SGLang's `_EVICTION_POLICY_FACTORIES`. One tenant's pinned share is capped
per window of eviction passes (`pinned_share`, `PassCap`).

How SGLang carries and pools p, bad priorities, trust and the cap: docs/design.md, "The SGLang
strategy".
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import threading
import weakref
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
DEFAULT_PINNED_SHARE = 0.5  # the vLLM plugin's default `pinned_share`


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


def node_tenant(node: Any) -> str:
    """A node's tenant as SGLang's tree separates them: its `RadixKey`'s `cache_salt` and
    `extra_key` (the request's own key, with its LoRA adapter's id appended); "" for
    neither, as `trust.tenant_of` names vLLM's."""
    key = getattr(node, "key", None)
    parts = []
    salt = getattr(key, "cache_salt", None)
    if isinstance(salt, str) and salt:
        parts.append(f"salt={salt}")
    extra = getattr(key, "extra_key", None)
    if isinstance(extra, str) and extra:
        parts.append(f"extra={extra}")
    return "|".join(parts)


class PassCap:
    """One tenant's pinned share of SGLang's eviction passes: `pinned_share` of the tokens
    evaluated, once nodes of a second tenant were evaluated.

    The strategy sees only `get_priority(node)`, which SGLang calls once for each evictable
    leaf when an eviction starts, then once for each parent that becomes an evictable leaf,
    and never twice for one node in one pass. So a node evaluated again (a leaf that survived
    a pass) is in a later pass, and starts a new window of evaluations: a window runs from a
    surviving leaf in one pass to just before the first surviving leaf of a later pass. A
    pass spans at most two windows (its nodes evaluated before its first survivor end the
    previous one); a window spans several passes when no leaf it evaluated survives between
    them. Within a window, a node whose trusted p is above the fallback p keeps it only while
    its tenant's tokens so keyed, its own included, are at most `pinned_share` of the tokens
    of every node the window evaluated, its own included; else it gets the fallback p
    (counted). The bound: in every window, each tenant's tokens keyed above the fallback p
    are at most `pinned_share` of the window's evaluated tokens (evictable leaves and the
    parents that became leaves), whatever SGLang's order of evaluation (a set's), which
    decides only which of its nodes keep their p. Nodes are held weakly (an evicted one
    leaves the window), so a new node never passes for an old one."""

    def __init__(self, pinned_share: float) -> None:
        self.pinned_share = pinned_share
        self.capped = 0  # evaluations keyed at the fallback p by the cap
        self.windows = 0  # windows started by a node evaluated again
        # This window's nodes, weakly: an evicted node leaves, so a node evaluated again is one
        # (an id() could be a freed node's); nodes without weak references are held.
        self._evaluated: weakref.WeakSet[Any] = weakref.WeakSet()
        self._held: list[Any] = []
        self._tokens = 0
        self._pinned: dict[str, int] = {}  # tenant -> its tokens keyed above the fallback
        self._lone_tenant: str | None = None
        self._shared = False  # nodes of a second tenant were evaluated: the cap binds

    def keeps(self, node: Any, pins: bool) -> bool:
        """Whether the node keeps its p; `pins`: the p is a trusted one above the fallback."""
        evaluated = self._evaluated
        try:
            again = node in evaluated
        except TypeError:
            again = any(held is node for held in self._held)
        if again:
            evaluated.clear()
            self._held.clear()
            self._tokens = 0
            self._pinned.clear()
            self.windows += 1
        try:
            evaluated.add(node)
        except TypeError:
            self._held.append(node)
        try:
            tokens = len(node.key)
        except Exception:  # no key to count: a node of no tokens
            tokens = 0
        self._tokens += tokens
        tenant = node_tenant(node)
        if not self._shared:
            if self._lone_tenant is None:
                self._lone_tenant = tenant
            elif tenant != self._lone_tenant:
                self._shared = True
        if not pins:
            return True
        pinned = self._pinned.get(tenant, 0) + tokens
        if self._shared and pinned > self.pinned_share * self._tokens:
            self.capped += 1
            return False
        self._pinned[tenant] = pinned
        return True

    def pinned_tokens(self) -> dict[str, int]:
        """Each tenant's tokens keyed above the fallback p in the current window."""
        return dict(self._pinned)


class LPCStrategy:
    """SGLang eviction strategy: smallest logit(p) + scale·last_access_time first."""

    def __init__(
        self,
        scale_per_s: float = DEFAULT_SCALE_PER_S,
        fallback_probability: float = DEFAULT_FALLBACK_PROBABILITY,
        probability_floor: float = DEFAULT_PROBABILITY_FLOOR,
        trust_request_priority: bool = False,
        pinned_share: float = DEFAULT_PINNED_SHARE,
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
        if (
            isinstance(pinned_share, bool)
            or not isinstance(pinned_share, int | float)
            or not 0.0 <= pinned_share <= 1.0  # NaN fails too
        ):
            raise ValueError(
                f"lpc eviction policy: pinned_share must be a number in [0, 1], "
                f"got {pinned_share!r}"
            )
        self.scale_per_s = float(scale_per_s)
        self.fallback_probability = float(fallback_probability)
        self.probability_floor = float(probability_floor)
        self.trust_request_priority = trust_request_priority
        self.invalid_priorities = 0  # evaluations of a node whose priority carries no p
        self.untrusted_priorities = 0  # evaluations of a node whose p was not trusted
        # The pinned cap: only trusted priorities can pin, and 1.0 is no cap.
        capping = trust_request_priority and pinned_share < 1.0
        self.pass_cap = PassCap(float(pinned_share)) if capping else None

    @property
    def pinned_share_capped(self) -> int:
        """Evaluations of a node keyed at the fallback p by the pinned cap."""
        return self.pass_cap.capped if self.pass_cap is not None else 0

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
        p = self.probability(node)
        cap = self.pass_cap
        if cap is not None and not cap.keeps(node, p > self.fallback_probability):
            p = self.fallback_probability
        return static_key(p, node.last_access_time, self.scale_per_s, self.probability_floor)


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
