"""Intervals of the two-tier replay: one pair against another, paired over conversations."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from lpc.access.source import access_source_factory
from lpc.replay.ab_options import ABOptions
from lpc.replay.ab_run import run_ab
from lpc.replay.latency import TierLatency, summarise_ttft
from lpc.replay.policies import parse_policies
from lpc.replay.two_tier import TierSettings, TwoTierRequestHits, TwoTierResult
from lpc.replay.two_tier_intervals import (
    pair_difference,
    replay_weights,
    ttft_per_request,
    versus_best,
    versus_best_text,
)
from tests.lpc.traces.helpers import bundled_lines, write_lines

LATENCY = TierLatency()
SHIPPED_ACCESS_MODEL = Path(__file__).resolve().parents[2] / "models" / "mooncake-access"
# No test here reads a PNG: `lpc ab` writes placeholders for its plots (tests/lpc/conftest.py)
pytestmark = pytest.mark.usefixtures("no_plots")


def result(
    gpu: str, cpu: str, device: list[int], host: list[int], conversations: list[int]
) -> TwoTierResult:
    prompts = [1024] * len(device)
    hits = TwoTierRequestHits(
        np.asarray(prompts, dtype=np.int64),
        np.asarray(device, dtype=np.int64),
        np.asarray(host, dtype=np.int64),
        np.asarray(conversations, dtype=np.int64),
    )
    ttft = summarise_ttft(LATENCY, prompts, device, host)
    return TwoTierResult(
        policy=gpu,
        offload_policy=cpu,
        cache_tokens=1000,
        offload_tokens=4000,
        requests=len(prompts),
        queried_tokens=sum(prompts),
        device_hit_tokens=sum(device),
        host_hit_tokens=sum(host),
        host_stored_chunks=0,
        host_evictions=0,
        allocation_failures=0,
        ttft_p50_s=ttft.p50_s,
        ttft_p90_s=ttft.p90_s,
        ttft_mean_s=ttft.mean_s,
        prefill_gpu_s_saved=ttft.prefill_gpu_s_saved,
        load_s=ttft.load_s,
        seconds=0.0,
        request_hits=hits,
    )


def random_pair(seed: int, n: int = 200, conversations: int = 60) -> tuple[list, list, list]:
    rng = np.random.default_rng(seed)
    conv = rng.integers(0, conversations, n).tolist()
    device = (rng.integers(0, 3, n) * 256).tolist()
    host = (rng.integers(0, 2, n) * 256).tolist()
    return device, host, conv


def test_a_pair_against_itself_differs_by_nothing() -> None:
    device, host, conv = random_pair(1)
    a = result("lpc-pooled", "lpc-pooled", device, host, conv)
    d = pair_difference(a, replace(a, policy="other"), LATENCY, n_resamples=200)
    for figure in (d.hit_ratio_points, d.ttft_p50_s, d.ttft_p90_s):
        assert figure.value == figure.low == figure.high == 0.0


def test_more_hits_everywhere_is_a_difference_clear_of_zero() -> None:
    device, host, conv = random_pair(2)
    worse = result("lru", "lru", device, host, conv)
    better = result("lpc-pooled", "lpc-pooled", [d + 256 for d in device], host, conv)
    d = pair_difference(better, worse, LATENCY, n_resamples=300)
    assert d.hit_ratio_points.value == pytest.approx(25.0)  # 256 more of 1,024 per request
    assert d.hit_ratio_points.low == pytest.approx(25.0)  # every resample: the same share
    assert d.ttft_p50_s.high < 0 and d.ttft_p90_s.high < 0  # faster in every resample
    assert d.ttft_p50_s.low <= d.ttft_p50_s.value <= d.ttft_p50_s.high


def test_the_hit_difference_of_each_resample_is_recomputed_by_hand() -> None:
    device, host, conv = random_pair(3, n=50, conversations=12)
    a = result("lpc-pooled", "lpc-pooled", device, host, conv)
    b_device, b_host, _ = random_pair(4, n=50, conversations=12)
    b = result("lru", "lru", b_device, b_host, conv)
    weights = replay_weights(np.asarray(conv), 5, 0)
    counts = np.random.default_rng(0).multinomial(12, [1 / 12] * 12, size=5)
    for row, draw in zip(weights, counts, strict=True):
        expected = [draw[c] for c in conv]
        assert row.tolist() == expected
    hits_a = np.add(device, host)
    hits_b = np.add(b_device, b_host)
    samples = [100 * (w @ hits_a - w @ hits_b) / (w @ np.full(50, 1024)) for w in weights]
    d = pair_difference(a, b, LATENCY, n_resamples=5)
    assert min(samples) <= d.hit_ratio_points.low <= d.hit_ratio_points.high <= max(samples)


def test_ttft_per_request_is_the_latency_model_of_each_request() -> None:
    a = result("lru", "lru", [0, 512], [256, 0], [0, 1])
    assert a.request_hits is not None
    ttft = ttft_per_request(a.request_hits, LATENCY)
    pair = LATENCY.prefill_s_per_token_pair
    assert pair > 0  # the default model prices attention
    assert ttft.tolist() == pytest.approx(
        [
            LATENCY.overhead_s
            + 768 / LATENCY.prefill_tokens_per_s
            + pair * (1024**2 - 256**2)
            + 256 * LATENCY.load_s_per_token,
            LATENCY.overhead_s + 512 / LATENCY.prefill_tokens_per_s + pair * (1024**2 - 512**2),
        ]
    )


def test_pairs_of_other_requests_are_refused() -> None:
    device, host, conv = random_pair(6)
    a = result("lpc-pooled", "lpc-pooled", device, host, conv)
    b = result("lru", "lru", device, host, [(c + 1) % 60 for c in conv])
    with pytest.raises(ValueError, match="same counted requests"):
        pair_difference(a, b, LATENCY)
    with pytest.raises(ValueError, match="per-request hits"):
        pair_difference(a, replace(b, request_hits=None), LATENCY)


def test_versus_best_takes_the_best_other_pair_of_each_figure() -> None:
    device, host, conv = random_pair(7)
    subject = result("lpc-pooled", "lpc-pooled", device, host, conv)
    lru = result("lru", "lru", [0] * len(device), host, conv)
    more_host = result("lru", "lhd", [0] * len(device), [h + 256 for h in host], conv)
    rows = versus_best([lru, subject, more_host], LATENCY, n_resamples=100)
    assert len(rows) == 1
    row = rows[0]
    assert row["subject"] == "lpc-pooled + lpc-pooled" and row["pairs_compared"] == 2
    assert row["hit_ratio"]["best_other"] == "lru + lhd"
    assert row["hit_ratio"]["difference"]["value"] == pytest.approx(
        100 * (subject.hit_ratio - more_host.hit_ratio)
    )
    assert row["ttft_p90_s"]["best_other"] in ("lru + lru", "lru + lhd")
    assert "device_hit_ratio_vs_lru_lru" not in row  # lru + lru hits nothing on the device
    assert "lru + lhd" in versus_best_text(rows)[0]
    assert versus_best([lru, more_host], LATENCY) == []  # no subject, nothing to say


def test_lpc_ab_reports_lpc_in_both_tiers_against_the_best_other_pair(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "slice.jsonl", bundled_lines()[:200])
    policies = tuple(parse_policies("lru,lpc-pooled"))
    outcome = run_ab(
        ABOptions(
            trace=path,
            policies=policies,
            cache_sizes_tokens=(1_000_000,),
            workers=1,
            progress=False,
            out_dir=tmp_path / "o",
            model_reads_text=False,
            tiers=TierSettings((2_000_000,), policies),
        ),
        model_factory=access_source_factory(SHIPPED_ACCESS_MODEL, log=lambda _: None),
        log=lambda _: None,
    )
    rows = outcome.to_json()["two_tier"]["versus_best"]
    assert len(rows) == 1 and rows[0]["pairs_compared"] == 3
    pairs = {(r.policy, r.offload_policy): r for r in outcome.two_tier}
    subject = pairs[("lpc-pooled", "lpc-pooled")]
    others = [r for key, r in pairs.items() if key != ("lpc-pooled", "lpc-pooled")]
    best = max(others, key=lambda r: r.hit_ratio)
    hit = rows[0]["hit_ratio"]
    assert hit["difference"]["value"] == pytest.approx(100 * (subject.hit_ratio - best.hit_ratio))
    assert hit["difference"]["low"] <= hit["difference"]["value"] <= hit["difference"]["high"]
    assert rows[0]["device_hit_ratio_vs_lru_lru"] == pytest.approx(
        subject.device_hit_ratio / pairs[("lru", "lru")].device_hit_ratio
    )
    assert "against the best other pair" in (tmp_path / "o" / "report.md").read_text()
