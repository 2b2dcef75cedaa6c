"""95 % intervals for the two-tier replay: one policy pair against another, paired over
conversations.

Three differences, subject minus other, each with its percentile interval over `N_RESAMPLES`
seeded resamples (`training.paired_bootstrap`, multinomial draws): the either-tier hit ratio
and the TTFT p50 and p90. `versus_best` compares LPC's pair with the best other pair.

The figures and how to read them: docs/design.md, "The replay's intervals".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from lpc.replay.latency import TierLatency
from lpc.replay.two_tier import TwoTierRequestHits, TwoTierResult
from training.paired_bootstrap import (
    CONFIDENCE,
    N_RESAMPLES,
    SEED,
    percentile_interval,
    resample_weights,
    weighted_percentile,
)

# LPC in both tiers as the product ships it: the plugin's default evictor on the GPU and the
# `LPCPooledCachePolicy` in vLLM's CPU tier.
SUBJECT = ("lpc-pooled", "lpc-pooled")


@dataclass(frozen=True)
class Difference:
    """subject − other, with its 95 % interval."""

    value: float
    low: float
    high: float

    def to_list(self) -> list[float]:
        return [self.value, self.low, self.high]


@dataclass(frozen=True)
class PairDifference:
    """Subject pair against another pair on the same requests: hit ratio in either tier
    (points, ×100), TTFT p50 and p90 (seconds)."""

    hit_ratio_points: Difference
    ttft_p50_s: Difference
    ttft_p90_s: Difference


def replay_weights(conversations: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """(resamples × requests) weights. The replay's conversation ids index the workload's
    conversations, so every index up to the largest counted one is drawn (multinomially)."""
    count = int(conversations.max()) + 1
    return resample_weights(conversations, n_resamples, seed, count=count, draw="multinomial")


def _interval(samples: np.ndarray, value: float, confidence: float) -> Difference:
    interval = percentile_interval(samples, confidence, omit_undefined=False)
    assert interval is not None  # with every draw read, there is always one
    return Difference(value, *interval)


def ttft_per_request(hits: TwoTierRequestHits, latency: TierLatency) -> np.ndarray:
    cached = (hits.device_hit_tokens + hits.host_hit_tokens).astype(np.float64)
    missed = hits.prompt_tokens.astype(np.float64) - cached
    return latency.ttft_s(missed, hits.host_hit_tokens.astype(np.float64), cached)


def _paired_hits(
    subject: TwoTierResult, other: TwoTierResult
) -> tuple[TwoTierRequestHits, TwoTierRequestHits]:
    a, b = subject.request_hits, other.request_hits
    if a is None or b is None:
        raise ValueError("a paired interval needs both replays' per-request hits")
    if not (
        np.array_equal(a.conversations, b.conversations)
        and np.array_equal(a.prompt_tokens, b.prompt_tokens)
    ):
        raise ValueError("a paired interval needs two replays of the same counted requests")
    if len(a.conversations) == 0:
        raise ValueError("no counted request to compare")
    return a, b


def _figure(
    figure: str,
    subject: TwoTierResult,
    other: TwoTierResult,
    latency: TierLatency,
    weights: np.ndarray,
    confidence: float,
) -> Difference:
    """One figure's difference (`hit_ratio_points`, `ttft_p50_s` or `ttft_p90_s`) under the
    resampling `weights` (resamples × requests)."""
    a, b = _paired_hits(subject, other)
    if figure == "hit_ratio_points":
        hits = (a.device_hit_tokens + a.host_hit_tokens) - (b.device_hit_tokens + b.host_hit_tokens)
        samples = 100.0 * (weights @ hits) / (weights @ a.prompt_tokens)
        return _interval(samples, 100.0 * (subject.hit_ratio - other.hit_ratio), confidence)
    q = {"ttft_p50_s": 0.5, "ttft_p90_s": 0.9}[figure]
    samples = weighted_percentile(ttft_per_request(a, latency), weights, q)
    samples -= weighted_percentile(ttft_per_request(b, latency), weights, q)
    value = getattr(subject, figure) - getattr(other, figure)
    return _interval(samples, value, confidence)


FIGURES = ("hit_ratio_points", "ttft_p50_s", "ttft_p90_s")


def pair_difference(
    subject: TwoTierResult,
    other: TwoTierResult,
    latency: TierLatency,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> PairDifference:
    """The subject pair minus the other, each figure with its paired bootstrap interval.
    Both must come from replays of the same workload (the same counted requests)."""
    a, _ = _paired_hits(subject, other)
    weights = replay_weights(a.conversations, n_resamples, seed)
    return PairDifference(
        *(_figure(f, subject, other, latency, weights, confidence) for f in FIGURES)
    )


def _label(result: TwoTierResult) -> str:
    return f"{result.policy} + {result.offload_policy}"


def versus_best(
    results: Sequence[TwoTierResult],
    latency: TierLatency,
    subject: tuple[str, str] = SUBJECT,
    n_resamples: int = N_RESAMPLES,
) -> list[dict]:
    """At each (GPU size, CPU size) where the subject pair was replayed: its hit ratio in
    either tier against the best other pair's, its TTFT p50 and p90 against the lowest other
    pair's, each difference with its interval, and its device hit ratio against lru + lru's
    (when replayed). Empty when the subject pair is not in `results`."""
    by_sizes: dict[tuple[int, int], list[TwoTierResult]] = {}
    for r in results:
        by_sizes.setdefault((r.cache_tokens, r.offload_tokens), []).append(r)
    rows = []
    for (gpu_size, cpu_size), group in by_sizes.items():
        mine = [r for r in group if (r.policy, r.offload_policy) == subject]
        others = [r for r in group if (r.policy, r.offload_policy) != subject]
        if not mine or not others or mine[0].request_hits is None:
            continue
        me = mine[0]
        assert me.request_hits is not None
        weights = replay_weights(me.request_hits.conversations, n_resamples, SEED)
        best_hit = max(others, key=lambda r: r.hit_ratio)
        best_p50 = min(others, key=lambda r: r.ttft_p50_s)
        best_p90 = min(others, key=lambda r: r.ttft_p90_s)
        row: dict = {
            "subject": _label(me),
            "cache_tokens": gpu_size,
            "offload_tokens": cpu_size,
            "pairs_compared": len(others),
        }
        for figure, best, attribute in (
            ("hit_ratio", best_hit, "hit_ratio_points"),
            ("ttft_p50_s", best_p50, "ttft_p50_s"),
            ("ttft_p90_s", best_p90, "ttft_p90_s"),
        ):
            difference = _figure(attribute, me, best, latency, weights, CONFIDENCE)
            row[figure] = {
                "subject": getattr(me, figure),
                "best_other": _label(best),
                "best_other_value": getattr(best, figure),
                "difference": asdict(difference),
            }
        lru = [r for r in others if (r.policy, r.offload_policy) == ("lru", "lru")]
        if lru and lru[0].device_hit_ratio > 0:
            row["device_hit_ratio_vs_lru_lru"] = me.device_hit_ratio / lru[0].device_hit_ratio
        rows.append(row)
    return rows


def versus_best_text(rows: Sequence[dict]) -> list[str]:
    """One line per pair of sizes (the terminal's and the markdown report's)."""
    lines = []
    for row in rows:
        hit, p50, p90 = row["hit_ratio"], row["ttft_p50_s"], row["ttft_p90_s"]

        def points(d: dict) -> str:
            return f"{d['value']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]"

        def ms(d: dict) -> str:
            return f"{1000 * d['value']:+.1f} [{1000 * d['low']:+.1f}, {1000 * d['high']:+.1f}] ms"

        ratio = row.get("device_hit_ratio_vs_lru_lru")
        device = f"; device hits {ratio:.2f}x lru + lru's" if ratio is not None else ""
        lines.append(
            f"{row['subject']} at {row['cache_tokens']:,} + {row['offload_tokens']:,} tokens "
            f"(against {row['pairs_compared']} other pairs){device}: either-tier hit ratio "
            f"{100 * hit['subject']:.2f}% vs {hit['best_other']}'s "
            f"{100 * hit['best_other_value']:.2f}%: {points(hit['difference'])} points; "
            f"TTFT p50 vs {p50['best_other']}: {ms(p50['difference'])}; "
            f"p90 vs {p90['best_other']}: {ms(p90['difference'])}"
        )
    return lines
