"""Golden tests: every policy's pinned hit tokens (tests/golden/expected.json) at three cache
sizes on small Mooncake and ShareGPT slices, and a few two-tier pairs; one token off fails.

A failure lists every (policy, size) whose hits moved. If the change is intended, regenerate
(`python -m tests.golden.regenerate --case NAME`) and say why in the commit.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from eviction import POLICIES
from lpc.replay.policies import LPC_VARIANTS, RETURN_VARIANTS
from tests.golden.cases import CASES, EXPECTED, Case

EXPECTED_TABLES: dict[str, dict[str, int]] = json.loads(EXPECTED.read_text())


def _params() -> list:
    params = []
    for case in CASES:
        marks = [pytest.mark.slow] if case.slow else []
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


@pytest.mark.parametrize("case", _params())
def test_hit_tokens_match_the_pinned_values(case: Case, tmp_path, monkeypatch) -> None:
    if case.needs_rivals and importlib.util.find_spec("libcachesim") is None:
        pytest.skip("libcachesim is not installed (pip install 'lpc[rivals]'): lrb and 3l-cache")
    monkeypatch.setenv("LPC_CACHE_DIR", str(tmp_path / "cache"))
    got = case.compute(tmp_path)
    expected = EXPECTED_TABLES[case.name]
    moved = [
        f"{key}: pinned {expected.get(key)}, now {got.get(key)}"
        for key in sorted(set(expected) | set(got))
        if expected.get(key) != got.get(key)
    ]
    assert not moved, f"{case.name}: hit tokens moved:\n" + "\n".join(moved)


def test_every_policy_and_variant_is_pinned() -> None:
    """A policy added to the registry (or a variant to the replay) needs a golden row."""
    pinned = {key.split("@")[0].partition("=")[0] for t in EXPECTED_TABLES.values() for key in t}
    names = {n for n, e in POLICIES.items() if e.kind != "learned"}
    names |= set(LPC_VARIANTS) | set(RETURN_VARIANTS)
    # lpc-trace replays the probabilities a trace logged: the same evictor as lpc-const,
    # fed per request (the bundled traces log none; tests/lpc/traces cover the reading).
    missing = sorted(names - pinned - {"lpc-trace"})
    assert not missing, f"no golden row for {', '.join(missing)}"


def test_each_size_separates_the_policies() -> None:
    """The sizes were chosen where the policies part ways: a golden row that every policy
    shares at a size would pin nothing about any of them."""
    for name in ("mooncake", "sharegpt"):
        by_size: dict[str, set[int]] = {}
        for key, hits in EXPECTED_TABLES[name].items():
            by_size.setdefault(key.rsplit("@", 1)[1], set()).add(hits)
        assert all(len(values) >= 5 for values in by_size.values()), (name, by_size)


def test_the_pinned_values_keep_the_policies_in_order() -> None:
    """What the pinned figures must satisfy whatever the code: belady bounds every policy at
    every size, LPC with one constant p is LRU (any p), and LRU's hits grow with the cache."""
    for name in ("mooncake", "sharegpt"):
        rows: dict[int, dict[str, int]] = {}
        for key, hits in EXPECTED_TABLES[name].items():
            policy, size = key.rsplit("@", 1)
            rows.setdefault(int(size), {})[policy] = hits
        for size, row in rows.items():
            assert row["belady"] == max(row.values()), (name, size)
            assert row["lpc-const"] == row["lpc-const=0.9"] == row["lru"], (name, size)
        lru = [rows[size]["lru"] for size in sorted(rows)]
        assert lru == sorted(lru) and lru[0] < lru[-1], (name, lru)
