"""The training-part study scripts: their written rules, and the registry swap they share."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import eviction.registry as registry
from lpc.errors import UserError

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the scripts import their shared helper
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _criterion(values: dict[tuple[str, float], float]) -> dict[tuple[str, float], float]:
    grid = {(t, m): 0.10 for t in ("flat", "log-linear") for m in (1.0, 2.0, 4.0, 8.0)}
    return {**grid, **values}


def test_the_tail_and_multiplier_rules_as_written(monkeypatch) -> None:
    study = _load("return_model_choices", monkeypatch)
    choose = study.choose
    # Nothing more than a point better: the shipped flat tail and m = 4 stay.
    assert choose(_criterion({("log-linear", 4.0): 0.109, ("flat", 1.0): 0.109})) == ("flat", 4.0)
    # The log-linear tail more than a point better at m = 4 wins; then the best m.
    assert choose(_criterion({("log-linear", 4.0): 0.12, ("log-linear", 8.0): 0.14})) == (
        "log-linear",
        8.0,
    )
    # A smaller m within a point of the best wins.
    assert choose(_criterion({("flat", 8.0): 0.15, ("flat", 2.0): 0.145})) == ("flat", 2.0)
    assert study.choose_pooling(0.12, 0.109) == "or"
    assert study.choose_pooling(0.118, 0.109) == "max"
    # The shared floor: none unless more than a point better; the smallest within a point.
    floor = study.choose_shared_floor
    assert floor({0.25: 0.11, 0.5: 0.118, 1.0: 0.119}, 0.109) is None
    assert floor({0.25: 0.11, 0.5: 0.125, 1.0: 0.13}, 0.109) == 0.5
    assert floor({0.25: 0.14, 0.5: 0.125, 1.0: 0.13}, 0.109) == 0.25
    assert study.choose_ties(0.12, 0.109) == "age"
    assert study.choose_ties(0.118, 0.109) == "depth"
    # The claim memory: lpc-pooled's 600 s, only if more than a point better.
    assert study.choose_claim_memory(0.1143, 0.1108) is None
    assert study.choose_claim_memory(0.122, 0.1108) == 600.0
    # The online floor replaces rule 6's fixed one only if more than a point better.
    assert study.choose_online_floor(0.118, 0.1108, 0.25) == 0.25
    assert study.choose_online_floor(0.122, 0.1108, 0.25) == "online"
    # Its second look: more than a point better on the second window, not worse on the first.
    again = study.choose_online_floor_again
    assert again(0.122, 0.1108, 0.1207, 0.1108, 0.25) == "online"
    assert again(0.118, 0.1108, 0.1207, 0.1108, 0.25) == 0.25
    assert again(0.122, 0.1108, 0.1100, 0.1108, 0.25) == 0.25


def test_sizes_without_a_gap_are_left_out_of_the_second_windows_mean(monkeypatch) -> None:
    study = _load("return_model_choices", monkeypatch)
    closed = {1: 0.2, 2: 0.4, 3: -3.0}
    lru = {1: 0.10, 2: 0.20, 3: 0.30}
    belady = {1: 0.20, 2: 0.25, 3: 0.305}
    assert study.mean_gap_closed(closed, lru, belady, 0.01) == (pytest.approx(0.3), [1, 2])
    assert study.mean_gap_closed(closed, lru, belady, 0.0)[1] == [1, 2, 3]
    with pytest.raises(ValueError, match="no size has an LRU→Belady gap"):
        study.mean_gap_closed(closed, lru, belady, 0.2)


def test_the_registry_entry_comes_back_after_a_failed_replay(monkeypatch, tmp_path) -> None:
    helper = _load("study_replay", monkeypatch)
    entry = registry.POLICIES["lpc-return"]
    with pytest.raises(UserError, match="unknown policy"):
        helper.replay_with_return_evictor(object, "no-such-policy", [1000], tmp_path)
    assert registry.POLICIES["lpc-return"] is entry
    assert helper.gap_closed(0.3, 0.2, 0.4) == pytest.approx(0.5)
    assert helper.gap_closed(0.3, 0.4, 0.4) == 0.0


def test_the_cpu_half_rule_as_written(monkeypatch) -> None:
    study = _load("two_tier_cpu_policy", monkeypatch)
    sizes = study.CPU_SIZES
    pooled = dict(zip(sizes, (0.283, 0.354, 0.385), strict=True))

    def pick(returned: tuple[float, float, float]) -> str:
        ratios = {"lpc-pooled": pooled, "lpc-return-model": dict(zip(sizes, returned, strict=True))}
        return study.choose(ratios)

    assert pick((0.284, 0.354, 0.386)) == "lpc-return-model"  # not below anywhere, higher mean
    assert pick((0.290, 0.350, 0.390)) == "lpc-pooled"  # higher mean, below at 16M
    assert pick((0.283, 0.354, 0.385)) == "lpc-pooled"  # equal everywhere: not higher


def _pair_result(gpu: str, cpu: str, size: int, hit: float, p50: float, p90: float):
    from types import SimpleNamespace

    device = round(hit * 1000)  # hit tokens of 1,000 prompt tokens, split as a pair might
    return SimpleNamespace(
        policy=gpu,
        offload_policy=cpu,
        offload_tokens=size,
        queried_tokens=1000,
        device_hit_tokens=device // 3,
        host_hit_tokens=device - device // 3,
        hit_ratio=hit,
        ttft_p50_s=p50,
        ttft_p90_s=p90,
    )


def test_the_best_other_pair_rule_as_written(monkeypatch) -> None:
    study = _load("two_tier_best_pair", monkeypatch)
    results = []
    for size in study.CPU_SIZES:
        results += [
            # LPC in both tiers is never its own competitor, even when it leads
            _pair_result("lpc-pooled", "lpc-pooled", size, 0.50, 0.100, 0.500),
            _pair_result("lru", "lru", size, 0.30, 0.140, 0.700),
            _pair_result("lhd", "lpc-pooled", size, 0.32, 0.150, 0.690),
            _pair_result("wa", "lhd", size, 0.32, 0.120, 0.710),  # ties on hits: grid order
        ]
        # the same hits, another device/host split: its float ratio rounds higher, and
        # must not win the tie
        results[-1].device_hit_tokens += 1
        results[-1].host_hit_tokens -= 1
        results[-1].hit_ratio += 1e-15
    chosen = study.best_others(results)
    for size in study.CPU_SIZES:
        assert chosen[size] == {
            "hit_ratio": ("lhd", "lpc-pooled"),
            "ttft_p50_s": ("wa", "lhd"),
            "ttft_p90_s": ("lhd", "lpc-pooled"),
        }


def test_the_gpu_addition_split(monkeypatch) -> None:
    from types import SimpleNamespace

    study = _load("two_tier_gpu_addition", monkeypatch)
    arrival = study.ARRIVAL
    failed = study.two_tier_grid.FAILED
    requests = [SimpleNamespace(num_prompt_tokens=n) for n in (100, 100, 100, 100)]
    workload = SimpleNamespace(
        block_size=10,
        first_counted=1,  # request 0 warms the tiers and is not counted
        cache_requests=requests,
        events=[(float(i), arrival, i) for i in range(4)] + [(9.0, "finish", 0)],
    )
    trace = SimpleNamespace(device_blocks=[5, 3, failed, 2])  # request 2 was not served
    tier = study.RecordingTier(SimpleNamespace())
    # (CPU hit after the GPU's, the CPU tier's own prefix) per served arrival: 0, 1, 3
    tier.calls = [(0, 9), (2, 5), (1, 4)]
    shares = study.split_hits(workload, trace, tier)
    # request 1: 3 + 2 = 5 blocks, all the CPU's own; request 3: 2 + 1 = 3 of an own 4
    assert shares == {
        "either": 80 / 200,
        "cpu_own_prefix": 90 / 200,
        "gpu_added": 0.0,
        "cpu_prefix_unused": 10 / 200,
    }
    tier.calls = [(0, 9), (4, 2), (1, 4)]  # request 1: 3 + 4 = 7 blocks, its CPU held 2
    assert study.split_hits(workload, trace, tier)["gpu_added"] == 50 / 200
