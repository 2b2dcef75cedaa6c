"""Reports of a two-tier replay: the per-pair table (terminal and markdown), CSV, JSON and a
plot of the hit ratio by tier against the CPU tier's size.

All figures come from `TwoTierResult`s; nothing here computes a hit.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lpc.replay.report import save_figure
from lpc.replay.two_tier import TierSettings, TwoTierResult
from predictor.atomic_files import atomic_open

TABLE_HEADER = [
    "gpu policy",
    "cpu policy",
    "gpu size",
    "cpu size",
    "device hit",
    "host hit",
    "hit (either)",
    "ttft p50 s",
    "ttft p90 s",
    "prefill GPU-s saved",
]


def _tokens(size: int) -> str:
    return f"{size / 1e6:g}M" if size >= 1_000_000 else f"{size / 1000:g}K"


def two_tier_rows(results: Sequence[TwoTierResult]) -> list[list[str]]:
    return [
        [
            r.policy,
            r.offload_policy,
            _tokens(r.cache_tokens),
            _tokens(r.offload_tokens),
            f"{r.device_hit_ratio:.1%}",
            f"{r.host_hit_ratio:.1%}",
            f"{r.hit_ratio:.1%}",
            f"{r.ttft_p50_s:.3f}",
            f"{r.ttft_p90_s:.3f}",
            f"{r.prefill_gpu_s_saved:,.0f}",
        ]
        for r in results
    ]


def two_tier_json(tiers: TierSettings, results: Sequence[TwoTierResult]) -> dict[str, Any]:
    return {
        "settings": {
            "offload_sizes_tokens": list(tiers.offload_sizes_tokens),
            "offload_policies": [p.label for p in tiers.offload_policies],
            "store_threshold": tiers.store_threshold,
            "latency": tiers.latency.to_dict(),
            "offload_gib": {
                str(s): tiers.latency.offload_gib(s) for s in tiers.offload_sizes_tokens
            },
        },
        "results": [r.to_dict() for r in results],
    }


def write_two_tier_csv(path: Path, results: Sequence[TwoTierResult]) -> None:
    rows = [r.to_dict() for r in results]
    with atomic_open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot_two_tier(path: Path, results: Sequence[TwoTierResult]) -> None:
    """Hit ratio in either tier (solid) and on the device alone (dotted) against the CPU
    tier's size, one line per policy pair and GPU size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple[str, str, int], list[TwoTierResult]] = {}
    for r in results:
        series.setdefault((r.policy, r.offload_policy, r.cache_tokens), []).append(r)
    several_sizes = len({r.cache_tokens for r in results}) > 1
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (gpu, cpu, size), rows in series.items():
        rows = sorted(rows, key=lambda r: r.offload_tokens)
        xs = [r.offload_tokens / 1e6 for r in rows]
        label = f"{gpu} / {cpu}" + (f" @ {_tokens(size)}" if several_sizes else "")
        (line,) = ax.plot(xs, [r.hit_ratio * 100 for r in rows], "-", marker="o", label=label)
        ax.plot(xs, [r.device_hit_ratio * 100 for r in rows], ":", color=line.get_color())
    ax.set_xlabel("CPU tier size (M tokens)")
    ax.set_ylabel("token hit ratio (%): either tier (solid), GPU (dotted)")
    ax.set_title("Two tiers: hit ratio by CPU tier size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    save_figure(fig, path)
