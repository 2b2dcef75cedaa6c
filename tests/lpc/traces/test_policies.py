"""The default policies on a trace follow the evictor registry."""

from __future__ import annotations

import pytest

from eviction import EVICTORS, LRUEvictor
from lpc.policies import TRACE_POLICY_CANDIDATES, default_trace_policies, parse_policy


def test_the_trace_defaults_are_the_registered_candidates() -> None:
    names = default_trace_policies()
    assert names[:3] == ("lru", "fifo", "lfu") and names[-2:] == ("oracle", "belady")
    assert {"lpc-turns", "lpc-const"} <= set(names)
    assert all(parse_policy(n).evictor in EVICTORS for n in names)


def test_a_newly_registered_heuristic_joins_the_trace_defaults(monkeypatch) -> None:
    missing = [n for n in ("s3fifo", "sieve", "arc") if n not in EVICTORS]
    if not missing:
        pytest.skip("every candidate heuristic is registered")
    name = missing[0]
    before = default_trace_policies()
    monkeypatch.setitem(EVICTORS, name, LRUEvictor)
    after = default_trace_policies()
    assert name in after and name not in before
    assert list(after) == [n for n in TRACE_POLICY_CANDIDATES if n in after]
    assert parse_policy(name).evictor == name


def test_an_unregistered_name_is_still_refused() -> None:
    with pytest.raises(ValueError, match="unknown policy 'mru'"):
        parse_policy("mru")
