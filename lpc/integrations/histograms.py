"""Fixed-bucket histograms for the plugin's hot paths: an observation is one bisection and one
increment in a preallocated array, nothing kept per observation; a scrape copies the counts.

Observations come from the engine's scheduler thread; a scrape reads from the metrics server's
thread without a lock, so a scrape may see a count one observation ahead of the sum (harmless
for monitoring; nothing is ever lost or double counted).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

# Release latency, in ns: 1 µs to 10 ms.
RELEASE_LATENCY_BOUNDS_NS = (
    1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000,
    1_000_000, 2_000_000, 5_000_000, 10_000_000,
)  # fmt: skip
PROBABILITY_BOUNDS = tuple(round(0.05 * i, 2) for i in range(1, 21))  # 0.05, 0.10, ..., 1.0
# Seconds from a cached block's release to its eviction: 1 s to 2 h.
EVICTION_AGE_BOUNDS_S = (1, 2, 5, 10, 30, 60, 120, 180, 300, 600, 1200, 1800, 3600, 7200)


@dataclass(frozen=True)
class HistogramSnapshot:
    """Counts per bucket (`counts[i]`: observations ≤ `bounds[i]` and above the bound before;
    the last count: above every bound), their sum and total, in the histogram's unit."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float
    count: int

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON values (what `stats_snapshot` holds; `of` reads it back)."""
        return {**asdict(self), "bounds": list(self.bounds), "counts": list(self.counts)}

    @classmethod
    def of(cls, value: HistogramSnapshot | dict[str, Any]) -> HistogramSnapshot:
        if isinstance(value, HistogramSnapshot):
            return value
        return cls(tuple(value["bounds"]), tuple(value["counts"]), value["total"], value["count"])

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations ≤ it), +inf last: Prometheus's buckets."""
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out

    def divided(self, divisor: float) -> HistogramSnapshot:
        """The same histogram in a larger unit (ns -> s: 1e9; dividing keeps 5e-06 exact)."""
        return HistogramSnapshot(
            tuple(b / divisor for b in self.bounds), self.counts, self.total / divisor, self.count
        )


class Histogram:
    """Counts of observations per bucket of fixed upper bounds (ascending)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"histogram bounds must be ascending and distinct, got {bounds!r}")
        self.bounds = tuple(bounds)
        self.counts = array("q", bytes(8 * (len(self.bounds) + 1)))
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def observe_n(self, value: float, times: int) -> None:
        """`times` observations of one value (blocks of one release evicted together)."""
        self.counts[bisect_left(self.bounds, value)] += times
        self.total += value * times

    def snapshot(self) -> HistogramSnapshot:
        counts = tuple(self.counts)
        return HistogramSnapshot(self.bounds, counts, self.total, sum(counts))


class PluginHistograms:
    """The plugin's distributions: the release path's latency (ns: the plugin's own work, and
    the whole `KVCacheManager.free` — vLLM's loop and the LPC queue's work included, what the
    scheduler thread waits for), the in-process model's scoring of a step's finished requests
    (ns: before their frees, so in neither of those), the p releases carry, and the age of
    cached blocks at their eviction (s, on the queue's clock)."""

    __slots__ = (
        "eviction_age_s",
        "free_latency_ns",
        "probability",
        "release_latency_ns",
        "scoring_latency_ns",
    )

    def __init__(self) -> None:
        self.release_latency_ns = Histogram(RELEASE_LATENCY_BOUNDS_NS)
        self.free_latency_ns = Histogram(RELEASE_LATENCY_BOUNDS_NS)
        self.scoring_latency_ns = Histogram(RELEASE_LATENCY_BOUNDS_NS)
        self.probability = Histogram(PROBABILITY_BOUNDS)
        self.eviction_age_s = Histogram(EVICTION_AGE_BOUNDS_S)

    def snapshot(self) -> dict[str, HistogramSnapshot]:
        """By exported name (seconds for times)."""
        return {
            "release_seconds": self.release_latency_ns.snapshot().divided(1e9),
            "free_seconds": self.free_latency_ns.snapshot().divided(1e9),
            "scoring_seconds": self.scoring_latency_ns.snapshot().divided(1e9),
            "release_probability": self.probability.snapshot(),
            "eviction_age_seconds": self.eviction_age_s.snapshot(),
        }
