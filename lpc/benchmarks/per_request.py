"""Per-request figures both engine benchmarks report (`queue_bench`, `manager_bench`): the
requests' block size, their warm-up, p50 and p99 in microseconds, and LPC's ratio to stock."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

BLOCK_SIZE = 16
WARMUP_REQUESTS = 8  # the pool fills with cached blocks before anything is timed


@dataclass(frozen=True)
class Figure:
    """One operation's per-request times, in microseconds."""

    p50_us: float
    p99_us: float


def figure_of(samples_ns: list[int]) -> Figure:
    """p50 and p99 of per-request times (ns), in microseconds."""
    ordered = sorted(samples_ns)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return Figure(statistics.median(ordered) / 1e3, p99 / 1e3)


def compare_sides(
    samples_ns: dict[str, dict[str, list[int]]], calls: tuple[str, ...], side: str = "lpc"
) -> tuple[dict[str, dict[str, Figure]], dict[str, float], dict[str, float]]:
    """Per side (`stock`, `lpc`, ...) and call, the figure of its per-request times (ns);
    then `side`'s p50 and p99 over stock's, per call."""
    figures = {name: {c: figure_of(samples_ns[name][c]) for c in calls} for name in samples_ns}
    stock, other = figures["stock"], figures[side]
    return (
        figures,
        {c: other[c].p50_us / stock[c].p50_us for c in calls},
        {c: other[c].p99_us / stock[c].p99_us for c in calls},
    )
