"""LPC as an SGLang eviction strategy: the strategy itself, and SGLang's plugin machinery.

The default-suite checks of eviction order run the scenarios of `sglang_scenarios` on
`radix_standin.StandInRadixCache`, a small radix tree with SGLang's contract. Marked
`sglang` (in .sglang-venv): loading the plugin through SGLang's entry-point loader, the
policy registry building our strategy from `--radix-eviction-policy-config`, and SGLang's
own argument parser accepting `--radix-eviction-policy lpc`. The same scenarios on SGLang's
real `RadixCache` and `UnifiedRadixCache` are in test_sglang_real_radix.py. One tenant's
pinned share per eviction pass (`PassCap`): the pin experiment of test_trust.py on the
stand-in, and the bound on random trees of two tenants.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from eviction.lpc import static_key
from lpc.integrations.sglang_strategy import (
    LPCStrategy,
    PassCap,
    node_tenant,
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


# -- one tenant's pinned share per eviction pass ------------------------------------------------
ATTACK = probability_to_priority(1.0)
# The pin experiment of test_trust.py in tokens: eight chats of the victim (64 tokens, 32 more
# each turn, six turns, round robin), between any two of its requests two one-shot 64-token
# prompts of the attacker with a trusted p = 1.0; a tree of 2,048 tokens (128 blocks of 16).
CHATS, TURNS, SHOTS, TREE_TOKENS = 8, 6, 2, 2048


def cached_tokens(tree: StandInRadixCache) -> int:
    total, stack = 0, [tree.root]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        total += len(node.key)
    return total


def pin_experiment(strategy: Any) -> float:
    """The victim's hit ratio: each request matches its prompt, evicts what the tree is
    short of, and inserts the prompt with its priority under its tenant's `cache_salt`."""
    clock = {"now": 0.0}
    tree = StandInRadixCache(strategy, lambda: clock["now"])
    hits = total = shot = 0
    prompts = {c: [c * 10_000 + i for i in range(64)] for c in range(CHATS)}
    for turn in range(TURNS):
        for c in range(CHATS):
            if turn:
                prompts[c] = prompts[c] + [c * 10_000 + 32 * (turn + 1) + i for i in range(32)]
            requests = [("victim", prompts[c], 0)]
            for _ in range(SHOTS):
                requests.append(("attacker", [10**6 + 64 * shot + i for i in range(64)], ATTACK))
                shot += 1
            for salt, tokens, priority in requests:
                clock["now"] += 1.0
                _, hit = tree.match(tokens, cache_salt=salt)
                short = cached_tokens(tree) + len(tokens) - hit - TREE_TOKENS
                if short > 0:
                    tree.evict(short)
                tree.insert(tokens, priority, cache_salt=salt)
                if salt == "victim":
                    hits, total = hits + hit, total + len(tokens)
    return hits / total


def test_the_pin_experiment_on_the_stand_in_capped_uncapped_and_lru() -> None:
    """Uncapped, the attacker's p = 1.0 nodes outlast the victim's chats; capped per window,
    the victim keeps more of LRU's hits; a share of 0 is LRU's order exactly."""
    lru = pin_experiment(StandInLRU())
    uncapped = pin_experiment(LPCStrategy(trust_request_priority=True, pinned_share=1.0))
    half = LPCStrategy(trust_request_priority=True)  # pinned_share 0.5, the default
    capped = pin_experiment(half)
    none = pin_experiment(LPCStrategy(trust_request_priority=True, pinned_share=0.0))
    assert lru > 0, "the victim never hits: the workload tests nothing"
    assert uncapped < lru / 2
    assert capped > 2 * uncapped and half.pinned_share_capped > 0
    assert none == lru
    REPORT.append(
        f"SGLang stand-in pin experiment ({TREE_TOKENS} tokens, the attacker's p = 1.0 "
        f"trusted): the victim's hit ratio LRU {lru:.3f}, uncapped {uncapped:.3f}, "
        f"pinned_share 0.5 {capped:.3f} ({half.pinned_share_capped} evaluations capped)"
    )


class RecordingCap(PassCap):
    """`PassCap` that logs each evaluation: (window, tenant, tokens, keyed above fallback,
    the node's id)."""

    def __init__(self, pinned_share: float) -> None:
        super().__init__(pinned_share)
        self.log: list[tuple[int, str, int, bool, int]] = []

    def keeps(self, node: Any, pins: bool) -> bool:
        kept = super().keeps(node, pins)
        self.log.append((self.windows, node_tenant(node), len(node.key), pins and kept, node.id))
        return kept


def random_tokens(rng: random.Random) -> Sequence[int]:
    return [rng.randrange(4) for _ in range(rng.randrange(1, 12))]  # small alphabet: splits


@pytest.mark.parametrize("seed", range(20))
def test_each_windows_pinned_tokens_are_at_most_the_share(seed: int) -> None:
    """Random inserts, matches and evictions of two tenants with random priorities: in every
    window of evaluations (`PassCap`), each tenant's tokens keyed above the fallback p are
    at most `pinned_share` of the window's evaluated tokens; a pass with a leaf the window
    evaluated in the previous pass starts a new window at that leaf, so a pass spans at most
    two windows."""
    rng = random.Random(seed)
    share = rng.choice([0.0, 0.25, 0.5])
    strategy = LPCStrategy(trust_request_priority=True, pinned_share=share)
    cap = strategy.pass_cap = RecordingCap(share)
    clock = {"now": 0.0}
    tree = StandInRadixCache(strategy, lambda: clock["now"])
    tree.insert([0], ATTACK, cache_salt="a")
    tree.insert([0], 0, cache_salt="b")
    tree.evict(0)  # both tenants evaluated: the cap binds from here on
    start = len(cap.log)
    separated = 0
    last_pass: set[int] = set()
    for _ in range(60):
        clock["now"] += rng.choice([0.5, 5.0])
        salt = rng.choice(["a", "b"])
        action = rng.random()
        if action < 0.5:
            priority = rng.choice([0, 100_000, 900_000, ATTACK])
            tree.insert(random_tokens(rng), priority, cache_salt=salt)
        elif action < 0.7:
            tree.match(random_tokens(rng), cache_salt=salt)
        else:
            survivor = any(leaf.id in last_pass for leaf in tree.evictable_leaves())
            before, first = cap.windows, len(cap.log)
            tree.evict(rng.randrange(1, 20))
            evaluations = cap.log[first:]
            if evaluations:
                assert {e[0] for e in evaluations} <= {before, before + 1}
                if survivor:
                    assert evaluations[-1][0] == before + 1
                    separated += 1
            last_pass = {e[4] for e in evaluations if e[0] == cap.windows}  # in the window
    windows: dict[int, list[tuple[str, int, bool]]] = {}
    for window, tenant, tokens, pinned, _ in cap.log[start:]:
        windows.setdefault(window, []).append((tenant, tokens, pinned))
    for evaluations in windows.values():
        tokens = sum(n for _, n, _ in evaluations)
        for tenant in ("salt=a", "salt=b"):
            pinned = sum(n for t, n, p in evaluations if t == tenant and p)
            assert pinned <= share * tokens, (tenant, pinned, tokens)
    assert len(windows) > 1 and separated > 0


def test_a_lone_tenant_is_not_capped_and_a_second_one_makes_the_cap_bind() -> None:
    strategy = LPCStrategy(trust_request_priority=True, pinned_share=0.25)
    clock = {"now": 0.0}
    tree = StandInRadixCache(strategy, lambda: clock["now"])
    for i in range(4):
        tree.insert([10 * i, 10 * i + 1], ATTACK, cache_salt="a")
    tree.evict(0)
    assert strategy.pinned_share_capped == 0  # alone: every node keeps its p
    assert strategy.pass_cap is not None
    assert strategy.pass_cap.pinned_tokens() == {"salt=a": 8}
    tree.insert([99], 0, cache_salt="b")
    clock["now"] += 1.0
    order = [node.key.cache_salt for node in tree.evict(9)]
    # Shared: a quarter of the pass's 9 tokens at most keep p = 1.0, one 2-token node of the
    # attacker (which one: the pass's order of evaluation), evicted last; its other three
    # nodes take the fallback p.
    assert strategy.pinned_share_capped == 3
    assert strategy.pass_cap.pinned_tokens() == {"salt=a": 2}
    assert order[-1] == "a" and order.count("a") == 4


def test_a_node_evaluated_again_starts_a_new_pass() -> None:
    cap = PassCap(0.5)
    node = StandInRadixCache(LPCStrategy(), lambda: 0.0).insert([1, 2], 0, cache_salt="a")
    assert cap.keeps(node, True) and cap.windows == 0
    assert cap.keeps(node, True) and cap.windows == 1  # the same node: a new window
    assert cap.pinned_tokens() == {"salt=a": 2}


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan"), True, "0.5"])
def test_a_bad_pinned_share_names_the_field(share: Any) -> None:
    with pytest.raises(ValueError, match="pinned_share must be a number in \\[0, 1\\]"):
        LPCStrategy(pinned_share=share)


def test_without_trusted_priorities_or_at_one_nothing_is_capped() -> None:
    assert LPCStrategy(pinned_share=0.1).pass_cap is None  # untrusted: nothing pins
    assert LPCStrategy(trust_request_priority=True, pinned_share=1.0).pass_cap is None
    assert LPCStrategy(trust_request_priority=True).pass_cap is not None


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
