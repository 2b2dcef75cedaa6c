"""What the GPU tier adds to the hits of a CPU tier below it: measured per policy pair.

    lpc train --trace mooncake --split-at 884 --out /tmp/access-884
    python scripts/two_tier_gpu_addition.py --model /tmp/access-884 [--json]

The CPU tier stores every prompt write-through, so a hit in either tier is the CPU tier's own
prefix unless the GPU tier holds blocks the CPU tier has dropped. For each pair this script
splits the either-tier hit of every counted request into the prompt's head the CPU tier
held at its arrival (its own prefix, looked up from block 0: `lookup` changes nothing) and
the rest, which only the GPU tier's blocks made a hit: "GPU-added". It explains the 8M
result of docs/results.md ("The goals against a competitor chosen on the training part"),
where lhd above `lpc-pooled` beats LPC in both tiers on both parts, and chooses nothing.

Both parts are measured: the training part alone (split at 884 s, counted 884–1,768 s, the
access model `--model` trained before 884 s) and the evaluation part (the default split,
the shipped access model), GPU 2.5M tokens, CPU 8M / 16M / 32M tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from study_replay import SHIPPED_ACCESS_MODEL, TRAINING_PART, two_part_arguments, two_tier_ab

import lpc.replay.ab_pipeline as ab_pipeline
import lpc.replay.two_tier_grid as two_tier_grid
from lpc.workload import ARRIVAL

GPU_TOKENS = 2_500_000
CPU_SIZES = (8_000_000, 16_000_000, 32_000_000)
GPU_POLICIES = "lru,lpc-pooled,lhd"
CPU_POLICIES = "lpc-pooled,lru"


class RecordingTier:
    """A CPU tier that also notes, at each lookup, the prefix it holds from block 0."""

    def __init__(self, tier: Any) -> None:
        self.tier = tier
        self.calls: list[tuple[int, int]] = []  # (the CPU hit after the GPU's, its own prefix)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tier, name)

    def lookup(self, hashes: Sequence[Any], start: int, end: int) -> int:
        hit = self.tier.lookup(hashes, start, end)
        self.calls.append((hit, self.tier.lookup(hashes, 0, end)))
        return hit


def _recording(make_tier: Any, made: list[RecordingTier]) -> Any:
    """`host_tier` that wraps each tier it builds in a `RecordingTier`, kept in `made`."""

    def build(*args: Any, **kwargs: Any) -> RecordingTier:
        made.append(RecordingTier(make_tier(*args, **kwargs)))
        return made[-1]

    return build


def split_hits(workload: Any, trace: Any, tier: RecordingTier) -> dict[str, float]:
    """Shares of the counted prompt tokens: either tier, the CPU tier's own prefix, and what
    only the GPU tier's blocks made a hit."""
    block = workload.block_size
    arrivals = [
        i
        for _, kind, i in workload.events
        if kind == ARRIVAL and trace.device_blocks[i] != two_tier_grid.FAILED
    ]
    assert len(arrivals) == len(tier.calls), "one lookup per served arrival"
    prompt = either = own = added = unused = 0
    for i, (host_blocks, own_blocks) in zip(arrivals, tier.calls, strict=True):
        if i < workload.first_counted:
            continue
        hits = trace.device_blocks[i] + host_blocks
        prompt += workload.cache_requests[i].num_prompt_tokens
        either += hits * block
        own += own_blocks * block
        added += max(0, hits - own_blocks) * block
        unused += max(0, own_blocks - hits) * block
    return {
        "either": either / prompt,
        "cpu_own_prefix": own / prompt,
        "gpu_added": added / prompt,
        # the CPU tier's own prefix beyond the request's hit (0 unless the GPU's allocation
        # hit fell short of its lookup); either = own prefix + GPU-added − this
        "cpu_prefix_unused": unused / prompt,
    }


def measure(model: Path, out: Path, **options: Any) -> list[dict[str, Any]]:
    """Every pair of GPU_POLICIES × CPU_POLICIES at each CPU size, split as the module says."""
    rows: list[dict[str, Any]] = []
    original = ab_pipeline._two_tier_grid
    make_tier = two_tier_grid.host_tier

    def grid_and_split(workload: Any, ab_options: Any, tiers: Any, settings: Any) -> Any:
        """The grid, replayed here pair by pair with recording tiers (instead of `lpc ab`'s
        own grid, which would replay it all again)."""
        started = time.perf_counter()
        grid: list[Any] = []
        for spec in ab_options.policies:
            trace = two_tier_grid.replay_gpu_tier(workload, spec, GPU_TOKENS, settings)
            for offload in tiers.offload_policies:
                made: list[RecordingTier] = []
                two_tier_grid.host_tier = _recording(make_tier, made)
                try:
                    results = two_tier_grid.replay_host_tier(
                        workload, trace, offload, CPU_SIZES, settings
                    )
                finally:
                    two_tier_grid.host_tier = make_tier
                grid += results
                for size, tier, result in zip(CPU_SIZES, made, results, strict=True):
                    shares = split_hits(workload, trace, tier)
                    assert abs(shares["either"] - result.hit_ratio) < 1e-9, "not the replay's hits"
                    rows.append(
                        {
                            "pair": f"{spec.label} + {offload.label}",
                            "offload_tokens": size,
                            "device": result.device_hit_ratio,
                            **shares,
                        }
                    )
        gpu_replays = len(ab_options.policies)
        passes = gpu_replays * len(tiers.offload_policies)
        wall_s = time.perf_counter() - started
        return grid, two_tier_grid.GridTiming(wall_s, gpu_replays, 0.0, passes, 0.0, workers=1)

    ab_pipeline._two_tier_grid = grid_and_split
    try:
        two_tier_ab(model, GPU_POLICIES, CPU_POLICIES, GPU_TOKENS, CPU_SIZES, out, **options)
    finally:
        ab_pipeline._two_tier_grid = original
    return rows


def main() -> None:
    args = two_part_arguments(__doc__, "results/two-tier-gpu-addition")
    report = {
        "training": measure(args.model, args.out / "training", **TRAINING_PART),
        "evaluation": measure(SHIPPED_ACCESS_MODEL, args.out / "evaluation"),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for part, rows in report.items():
        print(f"{part} part: either tier = the CPU tier's own prefix + GPU-added (device hits)")
        print("  (less the own prefix a request did not use, shown when not 0)")
        for row in rows:
            print(
                f"  {row['offload_tokens'] // 1_000_000:>2}M {row['pair']:<26} "
                f"{100 * row['either']:6.2f} % = {100 * row['cpu_own_prefix']:6.2f} % + "
                f"{100 * row['gpu_added']:5.2f} %  (device {100 * row['device']:5.2f} %)"
                + (f" − {100 * row['cpu_prefix_unused']:.2f} %" if row["cpu_prefix_unused"] else "")
            )


if __name__ == "__main__":
    main()
