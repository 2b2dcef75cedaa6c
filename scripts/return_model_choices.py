"""Choose, on the training part, the tail and the window multiplier of `lpc-return-model`.

    lpc train-return --trace mooncake --split-at 884 --no-classifier --out /tmp/ret_884
    python scripts/return_model_choices.py --return-model /tmp/ret_884 [--json]

`lpc-return`'s multiplier m (W = m × turnover) was chosen by the perfect-knowledge bound,
and the learned curves stay flat beyond their grid's last point (840 s at split 0.5), so a
cache holding blocks longer than that cannot rank them (docs/results.md, "When a
conversation returns"). Both choices are made here for the learned curve source, on the
Mooncake trace's training part alone: a return model trained on its first half (before
884 s, by `lpc train-return`'s own rules), the training part replayed with its first half
warming the cache and its second half (884–1,768 s) counted, sizes 2.5M–16M.

The rule, written before any variant below was replayed:

1. Criterion: the mean, over the six sizes, of the share of the LRU→Belady gap closed
   (each size counts alike: the target is a share of the gap at every size).
2. Tail first, at the shipped m = 4: `log-linear` (the last interval's hazard per
   log-second goes on) replaces `flat` only if it raises the criterion by more than one
   point.
3. Then m ∈ {1, 2, 4, 8} with the chosen tail: the largest criterion; a smaller m within
   one point of it wins (the shipped m = 4 stays unless another is more than one point
   better).
4. The evaluation part is replayed once, with the chosen values, and only reported.

Added on 2026-11-28, after rules 1–4 had run (they kept the flat tail and m = 4) and after
the evaluation part had been read with them; written before this replay was run:

5. Pooling, with the tail and m of rules 2–3: `or` (a block shared by several
   conversations scores the chance that any of them returns within W, 1 − ∏(1 − P), as
   `lpc-pooled` pools) replaces `max` only if it raises the criterion by more than one point.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from collections.abc import Sequence
from pathlib import Path

import eviction.registry as registry
from eviction.return_window import ReturnWindowEvictor
from lpc.replay.ab_pipeline import ABOptions, run_ab
from lpc.replay.policies import parse_policies

TRAINING_PART = {"split_at": 884.0, "replay_until_s": 1768.0}  # the default cut is 1,768 s
SIZES = (2_500_000, 4_000_000, 6_000_000, 8_000_000, 12_000_000, 16_000_000)
TAILS = ("flat", "log-linear")
MULTIPLIERS = (1.0, 2.0, 4.0, 8.0)
SHIPPED_MULTIPLIER = 4.0
MARGIN = 0.01  # one point of the gap


def replay(
    return_model: Path,
    tail: str,
    multiplier: float,
    sizes: Sequence[int],
    policies: str,
    out: Path,
    pooling: str = "max",
) -> dict[str, dict[int, float]]:
    """Hit ratio per policy and size on the training part, `lpc-return` built with m and
    `pooling`."""
    entry = registry.POLICIES["lpc-return"]
    factory = functools.partial(ReturnWindowEvictor, window_multiplier=multiplier, pooling=pooling)
    registry.POLICIES["lpc-return"] = dataclasses.replace(entry, factory=factory)
    try:
        outcome = run_ab(
            ABOptions(
                trace=Path("mooncake"),
                policies=tuple(parse_policies(policies)),
                cache_sizes_tokens=tuple(sizes),
                model_reads_text=False,
                out_dir=out,
                progress=False,
                return_model=return_model,
                return_tail=tail,
                **TRAINING_PART,
            ),
            log=lambda _: None,
        )
    finally:
        registry.POLICIES["lpc-return"] = entry
    return {policy: dict(curve) for policy, curve in outcome.comparison.hit_ratio.items()}


def gap_closed(hit: float, lru: float, belady: float) -> float:
    return (hit - lru) / (belady - lru) if belady > lru else 0.0


def choose(criterion: dict[tuple[str, float], float]) -> tuple[str, float]:
    """Rules 2 and 3 of the module docstring."""
    shipped = criterion[("flat", SHIPPED_MULTIPLIER)]
    tail = (
        "log-linear" if criterion[("log-linear", SHIPPED_MULTIPLIER)] > shipped + MARGIN else "flat"
    )
    best = max(criterion[(tail, m)] for m in MULTIPLIERS)
    multiplier = SHIPPED_MULTIPLIER
    if best > criterion[(tail, SHIPPED_MULTIPLIER)] + MARGIN:
        multiplier = min(m for m in MULTIPLIERS if criterion[(tail, m)] >= best - MARGIN)
    return tail, multiplier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--return-model", type=Path, required=True)
    parser.add_argument("--cache-sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--out", type=Path, default=Path("results/return-model-choices"))
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    sizes = [int(s) for s in args.cache_sizes.split(",")]
    base = replay(args.return_model, "flat", SHIPPED_MULTIPLIER, sizes, "lru,belady", args.out)
    lru, belady = base["lru"], base["belady"]
    rows = []
    criterion: dict[tuple[str, float], float] = {}
    for tail in TAILS:
        for m in MULTIPLIERS:
            hit = replay(args.return_model, tail, m, sizes, "lpc-return-model", args.out)
            ratios = hit["lpc-return-model"]
            closed = [gap_closed(ratios[s], lru[s], belady[s]) for s in sizes]
            criterion[(tail, m)] = sum(closed) / len(closed)
            rows.append(
                {
                    "tail": tail,
                    "window_multiplier": m,
                    "pooling": "max",
                    "hit_ratio": {str(s): ratios[s] for s in sizes},
                    "gap_closed": {str(s): c for s, c in zip(sizes, closed, strict=True)},
                    "mean_gap_closed": criterion[(tail, m)],
                }
            )
            if not args.json:
                cells = " ".join(f"{c:>6.1%}" for c in closed)
                print(f"{tail:>10} m={m:g}: {cells}  mean {criterion[(tail, m)]:.1%}", flush=True)
    tail, multiplier = choose(criterion)
    pooled = replay(args.return_model, tail, multiplier, sizes, "lpc-return-model", args.out, "or")[
        "lpc-return-model"
    ]
    closed = [gap_closed(pooled[s], lru[s], belady[s]) for s in sizes]
    or_criterion = sum(closed) / len(closed)
    pooling = "or" if or_criterion > criterion[(tail, multiplier)] + MARGIN else "max"
    rows.append(
        {
            "tail": tail,
            "window_multiplier": multiplier,
            "pooling": "or",
            "hit_ratio": {str(s): pooled[s] for s in sizes},
            "gap_closed": {str(s): c for s, c in zip(sizes, closed, strict=True)},
            "mean_gap_closed": or_criterion,
        }
    )
    if not args.json:
        cells = " ".join(f"{c:>6.1%}" for c in closed)
        print(f"{tail:>10} m={multiplier:g} or: {cells}  mean {or_criterion:.1%}", flush=True)
    report = {
        "part": "training",
        "lru": {str(s): lru[s] for s in sizes},
        "belady": {str(s): belady[s] for s in sizes},
        "variants": rows,
        "chosen": {"tail": tail, "window_multiplier": multiplier, "pooling": pooling},
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"chosen: tail {tail}, m = {multiplier:g}, pooling {pooling}")


if __name__ == "__main__":
    main()
