"""Registered policies as pytest parameters, some marked slow to keep the default suite short.

Each `lrb` or `3l-cache` evictor builds a libCacheSim cache (0.1–0.3 s; LRB reserves about
190 MB) and lists its eviction order by evicting in a forked process, so the tests that run
every policy through hundreds of random steps run those two with the slow tests only; their
own fast tests are `tests/eviction/test_learned_caches.py`. `sglang-tlru` is `tlru` with
another history rule: both are checked step by step against their plain reference in the
default suite (`tests/eviction/test_tlru_reference.py`), and `tlru` runs in every generic test.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from eviction import POLICIES
from eviction.libcachesim_caches import LearnedCacheEvictor


def is_learned_cache(name: str) -> bool:
    factory = POLICIES[name].factory
    return isinstance(factory, type) and issubclass(factory, LearnedCacheEvictor)


SLOW_VARIANTS = frozenset({"sglang-tlru"})


def policy_params(names: Iterable[str]) -> list[Any]:
    """`names` for `pytest.mark.parametrize`, the learned caches and variants marked slow."""
    return [
        pytest.param(n, marks=pytest.mark.slow) if is_learned_cache(n) or n in SLOW_VARIANTS else n
        for n in names
    ]


# Each example of a learned cache builds a ~200 MB libCacheSim cache and forks to list its
# order, so the random-stream tests draw fewer of them (in their own slow test).
LEARNED_CACHE_EXAMPLES = 6


def other_policies(names: Iterable[str]) -> list[Any]:
    """`policy_params` of every name but the learned caches."""
    return policy_params(n for n in names if not is_learned_cache(n))


def learned_caches(names: Iterable[str]) -> list[str]:
    return [n for n in names if is_learned_cache(n)]
