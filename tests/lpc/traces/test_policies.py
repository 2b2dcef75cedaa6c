"""The default policies on a trace follow the evictor registry."""

from __future__ import annotations

import pytest

from eviction import EVICTORS, POLICIES
from lpc.replay.policies import TRACE_POLICY_CANDIDATES, default_trace_policies, parse_policy


def test_the_trace_defaults_are_the_registered_candidates() -> None:
    names = default_trace_policies()
    assert names[:3] == ("lru", "fifo", "lfu") and names[-2:] == ("oracle", "belady")
    assert {"lpc-turns", "lpc-const"} <= set(names)
    assert all(parse_policy(n).evictor in EVICTORS for n in names)


def test_the_trace_defaults_hold_every_registered_baseline() -> None:
    names = default_trace_policies()
    assert {"s3fifo", "sieve", "arc"} <= set(names)
    assert list(names) == [n for n in TRACE_POLICY_CANDIDATES if n in names]


def test_an_unregistered_candidate_drops_out_of_the_trace_defaults(monkeypatch) -> None:
    monkeypatch.delitem(POLICIES, "sieve")
    names = default_trace_policies()
    assert "sieve" not in names and {"s3fifo", "arc"} <= set(names)


def test_an_unregistered_name_is_still_refused() -> None:
    with pytest.raises(ValueError, match="unknown policy 'mru'"):
        parse_policy("mru")
