"""Should the CPU tier's `lpc-pooled` remember sharing for as long as that tier holds a chunk?

    lpc train --trace mooncake --split-at 884 --out /tmp/access-884
    python scripts/two_tier_memory_window.py --model /tmp/access-884 [--json]

`lpc-pooled` recognises a shared prefix through a hash memory: a content released by another
conversation within the last `memory_window_s` seconds (600 s) is shared, and a shared block's
probability is at least `p_shared` (eviction/lpc_pooled.py). The 600 s come from how long an
LRU cache of 16M tokens keeps a block on the training part (docs/results.md, "The protocol:
choices on the training part, intervals on the evaluation part", rule 3). A CPU tier of
8M–32M tokens behind a GPU tier keeps its chunks longer than that, so in the CPU tier the
memory may forget a sharing that the tier itself still shows, and a popular prefix reused
every 15 minutes is ranked as one conversation's private block.

The rule, written on 2026-11-29 before this script's first replay (the evaluation part was not
replayed with any memory window but 600 s):

- Replay the Mooncake trace's training part alone (split at 884 s, counted to 1,768 s), a
  2.5M-token GPU tier running `lpc-pooled` (access model trained before 884 s) above a CPU
  tier of 8M, 16M and 32M tokens.
- The tier's holding time: with `lru` in the CPU tier, its turnover by Little's law, the
  tier's chunks × the counted seconds / the chunks it evicted in them. The tier's window is
  that turnover rounded up to whole 5 minutes, and never below the shipped 600 s.
- Replay `lpc-pooled` in the CPU tier with the shipped window (600 s) and with each size's own
  window (nothing else changes: the label horizon of `p_shared` stays the access model's).
- The tier's own window is adopted for the CPU tier only if LPC in both tiers' either-tier
  hit ratio with it is not below the shipped window's at any of the three CPU sizes and its
  mean over the three is higher. Otherwise 600 s stays. Only then is the evaluation part
  replayed, once, with the chosen window, and only reported.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from study_replay import TRAINING_PART, two_tier_ab

import lpc.replay.two_tier as two_tier
from eviction.lpc_pooled import DEFAULT_MEMORY_WINDOW_S

GPU_TOKENS = 2_500_000
CPU_SIZES = (8_000_000, 16_000_000, 32_000_000)
GPU_POLICY = "lpc-pooled"
ROUND_S = 300.0
COUNTED_S = TRAINING_PART["replay_until_s"] - TRAINING_PART["split_at"]


@contextmanager
def cpu_memory_window(window_s: float) -> Iterator[None]:
    """The CPU tier's `lpc-pooled` built with `memory_window_s=window_s` (the GPU tier's is
    built elsewhere, `two_tier.gpu_tier`, and keeps the shipped window); restored after."""
    shipped = two_tier.evictor_options

    def with_window(spec: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        options = shipped(spec, *args, **kwargs)
        if spec.evictor == "lpc-pooled":
            options["memory_window_s"] = window_s
        return options

    two_tier.evictor_options = with_window
    try:
        yield
    finally:
        two_tier.evictor_options = shipped


def tier_windows(model: Path, out: Path) -> tuple[dict[int, float], dict[int, float]]:
    """Each CPU size's LRU turnover (s) on the training part, and the window the rule takes."""
    outcome = two_tier_ab(
        model, GPU_POLICY, "lru", GPU_TOKENS, CPU_SIZES, out / "lru", **TRAINING_PART
    )
    turnover: dict[int, float] = {}
    for result in outcome.two_tier:
        chunks = two_tier.num_blocks_for(result.offload_tokens, 512) - 1
        turnover[result.offload_tokens] = (
            chunks * COUNTED_S / result.host_evictions if result.host_evictions else math.inf
        )
    windows = {
        size: max(DEFAULT_MEMORY_WINDOW_S, math.ceil(t / ROUND_S) * ROUND_S)
        for size, t in turnover.items()
    }
    return turnover, windows


def either_tier(model: Path, window_s: float, sizes: tuple[int, ...], out: Path) -> dict:
    """LPC in both tiers' either-tier hit ratio (and device share) per CPU size, the CPU tier's
    memory window `window_s`."""
    with cpu_memory_window(window_s):
        outcome = two_tier_ab(
            model, GPU_POLICY, "lpc-pooled", GPU_TOKENS, sizes, out, workers=1, **TRAINING_PART
        )
    return {
        r.offload_tokens: {"either": r.hit_ratio, "device": r.device_hit_ratio}
        for r in outcome.two_tier
    }


def choose(shipped: dict[int, dict], own: dict[int, dict]) -> str:
    """The rule of the module docstring."""
    not_below = all(own[s]["either"] >= shipped[s]["either"] for s in CPU_SIZES)
    higher = sum(own[s]["either"] for s in CPU_SIZES) > sum(shipped[s]["either"] for s in CPU_SIZES)
    return "tier's own" if not_below and higher else "shipped 600 s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="access model before 884 s")
    parser.add_argument("--out", type=Path, default=Path("results/two-tier-memory-window"))
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    turnover, windows = tier_windows(args.model, args.out)
    shipped = either_tier(args.model, DEFAULT_MEMORY_WINDOW_S, CPU_SIZES, args.out / "600")
    own: dict[int, dict] = {}
    for window in sorted(set(windows.values())):
        sizes = tuple(s for s in CPU_SIZES if windows[s] == window)
        own.update(either_tier(args.model, window, sizes, args.out / f"{window:.0f}"))
    chosen = choose(shipped, own)
    if args.json:
        print(
            json.dumps(
                {
                    "part": "training",
                    "gpu": {"policy": GPU_POLICY, "tokens": GPU_TOKENS},
                    "lru_turnover_s": {str(s): t for s, t in turnover.items()},
                    "window_s": {str(s): w for s, w in windows.items()},
                    "shipped": {str(s): v for s, v in shipped.items()},
                    "own": {str(s): v for s, v in own.items()},
                    "chosen": chosen,
                },
                indent=2,
            )
        )
        return
    print(f"training part, LPC in both tiers (GPU {GPU_TOKENS:,} tokens): either (device)")
    for size in CPU_SIZES:
        print(
            f"CPU {size:>11,}: LRU turnover {turnover[size]:7.0f} s, window {windows[size]:5.0f}"
            f" s | 600 s {shipped[size]['either']:.3%} ({shipped[size]['device']:.2%})"
            f" | own {own[size]['either']:.3%} ({own[size]['device']:.2%})"
        )
    print(f"chosen: {chosen}")


if __name__ == "__main__":
    main()
