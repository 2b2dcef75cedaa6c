"""95 % confidence intervals for a policy's gain over LRU: a paired bootstrap over conversations.

Both policies replay the same requests, so each resample takes the same conversations for
both, and the statistic is gain = Σ hits(policy) / Σ hits(LRU) − 1 over those conversations.
The interval is the percentile interval of `N_RESAMPLES` seeded resamples
(`training.paired_bootstrap`), so the same replay always reports the same interval.

Why conversations, and what the interval describes: docs/design.md, "Statistics: paired
intervals" and "The replay's intervals".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpc.replay.simulator import RequestHits
from training.paired_bootstrap import (
    CONFIDENCE,
    N_RESAMPLES,
    SEED,
    paired_gain,
    percentile_interval,
    resample_weights,
)


@dataclass(frozen=True)
class GainInterval:
    gain: float  # Σ hits(policy) / Σ hits(baseline) − 1 over every counted conversation
    low: float
    high: float

    def to_list(self) -> list[float]:
        return [self.low, self.high]


def per_conversation(hits: RequestHits, count: int) -> np.ndarray:
    """Hit tokens summed per conversation."""
    return np.bincount(hits.conversations, weights=hits.hit_tokens, minlength=count)


def paired_gain_interval(
    policy: RequestHits,
    baseline: RequestHits,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> GainInterval | None:
    """The gain of `policy` over `baseline` and its bootstrap interval; None when the baseline
    hits nothing (no ratio) or fewer than two conversations are counted (nothing to resample).
    Both must come from replays of the same workload (same requests, same conversations)."""
    if not np.array_equal(policy.conversations, baseline.conversations):
        raise ValueError("a paired interval needs two replays of the same counted requests")
    count = int(policy.conversations.max()) + 1 if len(policy.conversations) else 0
    ours = per_conversation(policy, count)
    theirs = per_conversation(baseline, count)
    if count < 2 or theirs.sum() <= 0:
        return None

    if np.array_equal(ours, theirs):  # the same hits everywhere: every resample gives 0
        return GainInterval(0.0, 0.0, 0.0)

    weights = resample_weights(np.arange(count), n_resamples, seed, count=count)
    draws = paired_gain(ours, theirs, weights)
    interval = percentile_interval(draws, confidence, quantile="scipy", omit_undefined=False)
    assert interval is not None  # with every draw read, there is always one
    return GainInterval(paired_gain(ours, theirs), *interval)
