"""The return-time evictor in the CPU tier, with its 95 % intervals (evaluation part).

    python scripts/two_tier_return_intervals.py [--json]

docs/results.md ("When a conversation returns", "CPU tier") reports `lpc-return-model` in the
CPU tier of a 2.5M-token GPU tier at 8M / 16M / 32M tokens as point figures. This script
replays the same pairs (the default split, the shipped access and return models, the default
latency model) and gives each pair with `lpc-return-model` in the CPU tier against the same
GPU policy over `lpc-pooled` (what LPC ships in the CPU tier) and over `lru` (vLLM's
default), and against lru + lru: the difference in the either-tier hit ratio (points) and in
TTFT p50 and p90, each with the paired bootstrap interval over the evaluation part's
conversations of `lpc ab --offload-sizes` (`lpc.replay.two_tier_intervals`). It reports;
it chooses nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from study_replay import SHIPPED_ACCESS_MODEL, two_tier_ab

from lpc.replay.latency import TierLatency
from lpc.replay.two_tier_intervals import pair_difference

GPU_TOKENS = 2_500_000
CPU_SIZES = (8_000_000, 16_000_000, 32_000_000)
GPU_POLICIES = ("lpc-pooled", "lru")
SUBJECT_CPU = "lpc-return-model"
OTHERS_CPU = ("lpc-pooled", "lru")
SHIPPED_RETURN_MODEL = SHIPPED_ACCESS_MODEL.parent / "mooncake-return"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/two-tier-return-intervals"))
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    outcome = two_tier_ab(
        SHIPPED_ACCESS_MODEL,
        ",".join(GPU_POLICIES),
        ",".join((SUBJECT_CPU, *OTHERS_CPU)),
        GPU_TOKENS,
        CPU_SIZES,
        args.out,
        return_model=SHIPPED_RETURN_MODEL,
    )
    results = {(r.policy, r.offload_policy, r.offload_tokens): r for r in outcome.two_tier}
    latency = TierLatency()
    rows = []
    for gpu in GPU_POLICIES:
        for size in CPU_SIZES:
            subject = results[(gpu, SUBJECT_CPU, size)]
            others = [(gpu, cpu) for cpu in OTHERS_CPU] + [("lru", "lru")]
            for other_gpu, other_cpu in dict.fromkeys(others):
                other = results[(other_gpu, other_cpu, size)]
                d = pair_difference(subject, other, latency)
                rows.append(
                    {
                        "subject": f"{gpu} + {SUBJECT_CPU}",
                        "other": f"{other_gpu} + {other_cpu}",
                        "offload_tokens": size,
                        "subject_hit_ratio": subject.hit_ratio,
                        "other_hit_ratio": other.hit_ratio,
                        "hit_ratio_points": d.hit_ratio_points.to_list(),
                        "ttft_p50_ms": [1000 * x for x in d.ttft_p50_s.to_list()],
                        "ttft_p90_ms": [1000 * x for x in d.ttft_p90_s.to_list()],
                    }
                )
    if args.json:
        print(json.dumps({"gpu_tokens": GPU_TOKENS, "rows": rows}, indent=2))
        return

    def fmt(v: list[float], unit: str) -> str:
        return f"{v[0]:+.2f} [{v[1]:+.2f}, {v[2]:+.2f}]{unit}"

    for row in rows:
        print(
            f"CPU {row['offload_tokens']:>10,}  {row['subject']:<30} − {row['other']:<24} "
            f"either {fmt(row['hit_ratio_points'], ' pts')}  p50 {fmt(row['ttft_p50_ms'], ' ms')}"
            f"  p90 {fmt(row['ttft_p90_ms'], ' ms')}"
        )


if __name__ == "__main__":
    main()
