"""Latency summaries shared by the benchmark and the load test."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LatencySummary:
    count: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of_seconds(cls, seconds: Sequence[float]) -> LatencySummary:
        if len(seconds) == 0:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan, nan)
        ms = np.asarray(seconds, dtype=np.float64) * 1000.0
        p50, p95, p99 = np.percentile(ms, [50, 95, 99])
        return cls(
            len(ms),
            round(float(ms.mean()), 3),
            round(float(p50), 3),
            round(float(p95), 3),
            round(float(p99), 3),
            round(float(ms.max()), 3),
        )
