"""LPC as an SGLang eviction strategy: the strategy itself, and SGLang's plugin machinery.

The default-suite checks of eviction order run the scenarios of `sglang_scenarios` on
`radix_standin.StandInRadixCache`, a small radix tree with SGLang's contract. Marked
`sglang` (in .sglang-venv): loading the plugin through SGLang's entry-point loader, the
policy registry building our strategy from `--radix-eviction-policy-config`, and SGLang's
own argument parser accepting `--radix-eviction-policy lpc`. The same scenarios on SGLang's
real `RadixCache` and `UnifiedRadixCache` are in test_sglang_real_radix.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eviction.lpc import static_key
from lpc.integrations.sglang_strategy import (
    LPCStrategy,
    priority_to_probability,
    probability_to_priority,
)
from tests.integrations import sglang_scenarios
from tests.integrations.radix_standin import StandInRadixCache
from tests.integrations.report import REPORT
from tests.integrations.snippets import entry_point_site, run_snippet

EXPECTED_ORDER = ["B", "C", "D", "A"]  # by logit(p) + 0.01 t; LRU would say A, C, B, D
EXPECTED_POOLED_ORDER = ["Y", "Z", "X", "system"]
EXPECTED_LOCKED = {"while_locked": ["C", "A"], "b_cached": True, "after_unlock": ["B"]}
EXPECTED_SPLITS = {
    "after_match": {"X[:10]": 1100.0, "X[10:]": 1100.0},
    "after_insert": {
        "X[:5]": [900_000, 1200.0],
        "X[5:10]": [900_000, 1200.0],
        "X[10:]": [900_000, 1100.0],
        "Y": [100_000, 1200.0],
    },
    "order": ["Y", "X[10:]", "X[5:10]", "X[:5]"],
}


class StandInLRU:
    """SGLang's LRUStrategy, for the stand-in."""

    def get_priority(self, node: object) -> float:
        return node.last_access_time  # type: ignore[attr-defined]


def standin(strategy: object | None = None) -> sglang_scenarios.NewTree:
    """The stand-in tree with `strategy`, by default LPC behind a router that sets `priority`
    (trusted); `test_an_untrusted_priority_is_not_p` checks the default."""
    trusted = LPCStrategy(trust_request_priority=True)
    return lambda clock: StandInRadixCache(strategy or trusted, clock)


def test_priority_carries_p_in_parts_per_million() -> None:
    assert probability_to_priority(0.83) == 830_000
    assert probability_to_priority(0.0) == 1 and probability_to_priority(1.0) == 999_999
    assert priority_to_probability(830_000) == 0.83
    assert priority_to_probability(0) is None, "SGLang's 'no priority' means no prediction"
    assert priority_to_probability(None) is None and priority_to_probability(-5) is None
    # SGLang bumps the prompt part of a checkpoint by one; beyond the range clamps.
    assert priority_to_probability(1_000_000) == 0.999999
    with pytest.raises(ValueError):
        probability_to_priority(1.5)


class _Node:
    def __init__(self, priority: int, last_access_time: float) -> None:
        self.priority = priority
        self.last_access_time = last_access_time


def test_an_untrusted_priority_is_not_p() -> None:
    """By default a client's `priority` is not read as p: every node the fallback p, LRU's
    order (`sglang_strategy`'s trust boundary), and each ignored priority counted."""
    strategy = LPCStrategy(fallback_probability=0.3)
    assert strategy.get_priority(_Node(999_999, 50.0)) == pytest.approx(
        static_key(0.3, 50.0, 0.01, 1e-6)
    )
    assert strategy.untrusted_priorities == 1
    for seed in range(3):
        untrusted = sglang_scenarios.random_operations(standin(LPCStrategy()), seed, True)
        assert untrusted == sglang_scenarios.random_operations(standin(StandInLRU()), seed, True)
    with pytest.raises(ValueError, match="trust_request_priority must be true or false"):
        LPCStrategy(trust_request_priority="yes")  # type: ignore[arg-type]


def test_get_priority_is_lpcs_static_key() -> None:
    strategy = LPCStrategy(scale_per_s=0.02, fallback_probability=0.3, trust_request_priority=True)
    assert strategy.get_priority(_Node(830_000, 50.0)) == pytest.approx(
        static_key(0.83, 50.0, 0.02, 1e-6)
    )
    assert strategy.get_priority(_Node(0, 50.0)) == pytest.approx(static_key(0.3, 50.0, 0.02, 1e-6))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"scale_per_s": -1}, "scale_per_s must be a finite number >= 0, got -1"),
        ({"fallback_probability": 2}, "fallback_probability must be in [0, 1], got 2"),
        ({"probability_floor": 0.7}, "probability_floor must be in (0, 0.5), got 0.7"),
    ],
)
def test_bad_policy_config_names_the_field(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError) as error:
        LPCStrategy(**kwargs)
    assert "lpc eviction policy" in str(error.value) and fragment in str(error.value)


def test_leaves_are_evicted_by_lpc_key_not_recency() -> None:
    assert sglang_scenarios.order_by_key(standin())["order"] == EXPECTED_ORDER


def test_locked_nodes_are_never_evicted() -> None:
    assert sglang_scenarios.locked_never_evicted(standin()) == EXPECTED_LOCKED


def test_partial_node_splits_refresh_the_suffix_and_pool_the_prefix() -> None:
    assert sglang_scenarios.partial_node_splits(standin()) == EXPECTED_SPLITS


@pytest.mark.parametrize("seed", range(5))
def test_lpc_without_predictions_evicts_like_lru(seed: int) -> None:
    lru = sglang_scenarios.random_operations(standin(StandInLRU()), seed, with_priorities=False)
    lpc = sglang_scenarios.random_operations(standin(), seed, with_priorities=False)
    assert lru == lpc and len(lru) > 10
    with_p = sglang_scenarios.random_operations(standin(), seed, with_priorities=True)
    assert with_p != lru, "the predictions must change the order"


def test_a_shared_prefix_carries_the_max_p() -> None:
    result = sglang_scenarios.max_pooling(standin())
    assert result["order"] == EXPECTED_POOLED_ORDER
    assert result["shared_priority"] == probability_to_priority(0.9)
    assert result["shared_key"] == pytest.approx(static_key(0.9, 1010.0, 1e-2, 1e-6))


@pytest.mark.parametrize("seed", range(20))
def test_every_eviction_takes_the_lowest_decayed_probability(seed: int) -> None:
    result = sglang_scenarios.evicts_lowest_decayed_probability(standin(), seed)
    assert result["checked"] > 10 and result["violations"] == []


# -- against real SGLang 0.5.23 ------------------------------------------------------------
REAL_SGLANG = """
import argparse, json
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang
from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES
from sglang.srt.mem_cache.evict_policy import EvictionStrategy
from sglang.srt.mem_cache.utils import get_eviction_strategy
from sglang.srt.server_args import ServerArgs
out = {"version": sglang.__version__, "choices": list(RADIX_EVICTION_POLICY_CHOICES)}
parser = argparse.ArgumentParser(exit_on_error=False)
ServerArgs.add_cli_args(parser)
try:
    args = parser.parse_args(["--model-path", "m", "--radix-eviction-policy", "lpc",
                              "--radix-eviction-policy-config", '{"scale_per_s": 0.01}'])
    out["cli"] = [args.radix_eviction_policy, args.radix_eviction_policy_config]
except (SystemExit, argparse.ArgumentError) as error:
    out["cli"] = str(error)
if "lpc" in RADIX_EVICTION_POLICY_CHOICES:
    strategy = get_eviction_strategy("lpc", args.radix_eviction_policy_config)
    out["strategy"] = [type(strategy).__name__, isinstance(strategy, EvictionStrategy),
                       strategy.scale_per_s, strategy.fallback_probability]
    try:
        get_eviction_strategy("lpc", {"scale": 1})
    except TypeError as error:
        out["unknown_key"] = str(error)
print(json.dumps(out))
"""


@pytest.mark.sglang
def test_real_sglang_loads_and_uses_the_strategy(sglang_python: Path, tmp_path: Path) -> None:
    site = entry_point_site(tmp_path, "sglang.srt.plugins")
    out = json.loads(
        run_snippet(sglang_python, REAL_SGLANG, {"SGLANG_PLUGINS": "lpc"}, site).splitlines()[-1]
    )
    assert out["version"] == "0.5.23"
    assert "lpc" in out["choices"]
    assert out["cli"] == ["lpc", {"scale_per_s": 0.01}]
    assert out["strategy"] == ["LPCStrategy", True, 0.01, 0.5]
    assert "unexpected keyword argument 'scale'" in out["unknown_key"]
    REPORT.append(
        f"SGLang {out['version']}: plugin loaded by SGLang's entry-point loader; "
        f"--radix-eviction-policy lpc accepted by SGLang's parser; its registry built "
        f"{out['strategy'][0]}"
    )


@pytest.mark.sglang
def test_without_the_plugin_sglang_rejects_the_policy(sglang_python: Path, tmp_path: Path) -> None:
    site = entry_point_site(tmp_path, "sglang.srt.plugins")
    out = json.loads(
        run_snippet(sglang_python, REAL_SGLANG, {"SGLANG_PLUGINS": "other"}, site).splitlines()[-1]
    )
    assert "lpc" not in out["choices"]
    assert "invalid choice: 'lpc'" in out["cli"]
