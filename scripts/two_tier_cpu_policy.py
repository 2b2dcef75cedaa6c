"""Which LPC policy should hold the CPU tier of "LPC in both tiers": `lpc-pooled` or `lpc-return`?

    lpc train --trace mooncake --split-at 884 --out /tmp/access-884
    lpc train-return --trace mooncake --split-at 884 --no-classifier --out /tmp/ret_884
    python scripts/two_tier_cpu_policy.py --model /tmp/access-884 --return-model /tmp/ret_884 \
        [--json]

LPC in both tiers has run `lpc-pooled` in the CPU tier too: a 180-s continuation probability,
decayed with time, in a tier whose evictions come minutes after a release (docs/results.md,
"Two tiers"). The return-time evictor (`lpc-return`, fed `lpc-return-model`'s curves) asks
the tier's own question instead: P(the conversation returns within W | silent a), W from
that tier's turnover. Both run as vLLM `CachePolicy` classes (`LPCPooledCachePolicy`,
`LPCReturnCachePolicy`), each checked request by request against vLLM's manager.

The rule, written on 2026-11-28 before this script's first replay (the evaluation part's
figures of `lpc-pooled + lpc-return-model` with the evictor's earlier constants had been
read the day before; with today's shared floor and tie order they had not):

- Replay the Mooncake trace's training part alone (split at 884 s, counted to 1,768 s), a
  2.5M-token GPU tier running `lpc-pooled` (access model trained before 884 s) above a CPU
  tier of 8M, 16M and 32M tokens running `lpc-pooled` or `lpc-return-model` (return model
  trained before 884 s by `lpc train-return`'s rules); `lru` in the CPU tier beside them for
  reference.
- `lpc-return-model` becomes the CPU half of LPC in both tiers only if its either-tier hit
  ratio is not below `lpc-pooled`'s at any of the three CPU sizes and its mean over the
  three is higher. Otherwise `lpc-pooled` stays.
- The evaluation part is then replayed once with the chosen pair, and only reported.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from study_replay import TRAINING_PART, two_tier_ab

GPU_TOKENS = 2_500_000
CPU_SIZES = (8_000_000, 16_000_000, 32_000_000)
GPU_POLICY = "lpc-pooled"
CANDIDATES = ("lpc-pooled", "lpc-return-model")


def either_tier(model: Path, return_model: Path, out: Path) -> dict[str, dict[int, float]]:
    """The either-tier hit ratio per CPU policy and CPU size on the training part."""
    cpu_policies = ",".join((*CANDIDATES, "lru"))
    outcome = two_tier_ab(
        model,
        GPU_POLICY,
        cpu_policies,
        GPU_TOKENS,
        CPU_SIZES,
        out,
        return_model=return_model,
        **TRAINING_PART,
    )
    ratios: dict[str, dict[int, float]] = {}
    for result in outcome.two_tier:
        if result.policy == GPU_POLICY:
            ratios.setdefault(result.offload_policy, {})[result.offload_tokens] = result.hit_ratio
    return ratios


def choose(ratios: dict[str, dict[int, float]]) -> str:
    """The rule of the module docstring."""
    pooled, returned = ratios["lpc-pooled"], ratios["lpc-return-model"]
    not_below = all(returned[s] >= pooled[s] for s in CPU_SIZES)
    higher = sum(returned.values()) > sum(pooled.values())
    return "lpc-return-model" if not_below and higher else "lpc-pooled"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="access model before 884 s")
    parser.add_argument("--return-model", type=Path, required=True, help="return model, same")
    parser.add_argument("--out", type=Path, default=Path("results/two-tier-cpu-policy"))
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    ratios = either_tier(args.model, args.return_model, args.out)
    chosen = choose(ratios)
    if args.json:
        report = {
            "part": "training",
            "gpu": {"policy": GPU_POLICY, "tokens": GPU_TOKENS},
            "either_tier_hit_ratio": {
                p: {str(s): r for s, r in v.items()} for p, v in ratios.items()
            },
            "chosen": chosen,
        }
        print(json.dumps(report, indent=2))
        return
    print(f"training part, GPU {GPU_POLICY} {GPU_TOKENS:,} tokens: either-tier hit ratio")
    print(f"{'CPU policy':>18} " + " ".join(f"{s:>11,}" for s in CPU_SIZES))
    for policy, row in ratios.items():
        print(f"{policy:>18} " + " ".join(f"{row[s]:>11.2%}" for s in CPU_SIZES))
    print(f"chosen CPU half of LPC in both tiers: {chosen}")


if __name__ == "__main__":
    main()
