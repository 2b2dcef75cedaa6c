"""Routers: which instance serves a request, decided at its arrival.

A router sees what a production router sees then: each instance's queued tokens and requests
(those it holds: arrived, not yet finished), the request's conversation, and, for a
prefix-aware router, how many of the request's leading blocks each instance has cached. They
follow the routers fleets run:
- `round-robin`: instance i mod N for the i-th request;
- `least-loaded`: the fewest queued tokens (ties: the lowest index);
- `session-sticky`: a stable hash of the conversation picks the instance; when the fleet is
  out of balance and that instance is the busiest, the conversation moves (and stays moved)
  to the least-loaded instance;
- `prefix-aware`: SGLang's cache-aware router with its documented defaults (llm-d's precise
  prefix scorer and Dynamo's KV router weigh the same two signals): when the fleet is out of
  balance, the least-loaded instance; else the instance with the longest cached prefix when it
  covers at least `CACHE_THRESHOLD` of the prompt's blocks (ties broken by load), and the
  least-loaded instance when none does (a short shared system prompt does not pull every
  conversation onto one instance).

Out of balance (SGLang's rule, in queued requests): the busiest instance holds more than
`BALANCE_ABS_THRESHOLD` requests beyond the idlest and more than `BALANCE_REL_THRESHOLD` times
its requests. With one instance every router answers 0 and the fleet replay is the
single-instance replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import xxhash

from lpc.errors import InvalidInputError

# SGLang router's documented defaults for its cache-aware policy.
CACHE_THRESHOLD = 0.5
BALANCE_ABS_THRESHOLD = 32
BALANCE_REL_THRESHOLD = 1.0001
ROUTERS = ("round-robin", "least-loaded", "session-sticky", "prefix-aware")


class CachedPrefix(Protocol):
    """How many leading blocks of a request an instance has cached (`fleet_replay` gives it)."""

    def __call__(self, instance: int) -> int: ...


@dataclass(frozen=True, slots=True)
class Arrival:
    """What the router knows of an arriving request."""

    index: int  # the request's position in arrival order
    conversation_id: str
    tokens: int  # prompt and output: what it will queue on its instance
    prompt_blocks: int  # full blocks of its prompt a cache could serve


@dataclass(frozen=True, slots=True)
class Load:
    """Each instance's queued tokens and requests at the arrival."""

    tokens: Sequence[int]
    requests: Sequence[int]

    @property
    def instances(self) -> int:
        return len(self.tokens)


def least_loaded(load: Load) -> int:
    """The instance with the fewest queued tokens (the lowest index on a tie)."""
    tokens = load.tokens
    return min(range(len(tokens)), key=lambda i: (tokens[i], i))


def out_of_balance(load: Load) -> bool:
    """SGLang's rule: max − min queued requests > the absolute threshold and max > the
    relative threshold × min."""
    most, fewest = max(load.requests), min(load.requests)
    return most - fewest > BALANCE_ABS_THRESHOLD and most > BALANCE_REL_THRESHOLD * fewest


class Router(Protocol):
    name: str

    def route(self, arrival: Arrival, load: Load, cached: CachedPrefix) -> int: ...


@dataclass
class RoundRobin:
    name: str = "round-robin"
    _next: int = 0

    def route(self, arrival: Arrival, load: Load, cached: CachedPrefix) -> int:
        instance = self._next % load.instances
        self._next += 1
        return instance


@dataclass
class LeastLoaded:
    name: str = "least-loaded"

    def route(self, arrival: Arrival, load: Load, cached: CachedPrefix) -> int:
        return least_loaded(load)


def session_home(conversation_id: str, instances: int) -> int:
    """The conversation's instance by a stable hash (xxhash, not Python's salted `hash`)."""
    return xxhash.xxh64_intdigest(conversation_id.encode()) % instances


@dataclass
class SessionSticky:
    name: str = "session-sticky"
    _moved: dict[str, int] = field(default_factory=dict)  # conversation -> its new instance

    def route(self, arrival: Arrival, load: Load, cached: CachedPrefix) -> int:
        conversation = arrival.conversation_id
        instance = self._moved.get(conversation)
        if instance is None:
            instance = session_home(conversation, load.instances)
        requests = load.requests
        if out_of_balance(load) and requests[instance] == max(requests):
            instance = least_loaded(load)
            self._moved[conversation] = instance
        return instance


@dataclass
class PrefixAware:
    name: str = "prefix-aware"

    def route(self, arrival: Arrival, load: Load, cached: CachedPrefix) -> int:
        if load.instances == 1:
            return 0
        if out_of_balance(load):
            return least_loaded(load)
        matched = [cached(i) for i in range(load.instances)]
        best = max(matched)
        if best == 0 or best < CACHE_THRESHOLD * arrival.prompt_blocks:
            return least_loaded(load)
        tokens = load.tokens
        return min(
            (i for i in range(load.instances) if matched[i] == best), key=lambda i: (tokens[i], i)
        )


def make_router(name: str) -> Router:
    """A fresh router (routers keep state: the round-robin counter, moved sessions)."""
    if name == "round-robin":
        return RoundRobin()
    if name == "least-loaded":
        return LeastLoaded()
    if name == "session-sticky":
        return SessionSticky()
    if name == "prefix-aware":
        return PrefixAware()
    raise InvalidInputError(f"unknown router {name!r}; choose from {', '.join(ROUTERS)}")
