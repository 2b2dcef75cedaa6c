"""How long LRU keeps a released block on a trace, per cache size (the access model's horizon).

    python scripts/studies/lru_eviction_age.py [--trace mooncake] [--split-at 0.5] [--part training]
        [--json]

Replays the trace under LRU at each default trace cache size and prints the median and
quartiles of the time from a block's release to its eviction (docs/training.md §8,
docs/results.md "Real traffic"). `--part training` (what the protocol uses to choose a
horizon, docs/results.md "The protocol: choices on the training part, intervals on the
evaluation part") replays the training part alone, its first half
warming the cache, and measures the evictions of its second half; `--part evaluation` (the
default, kept to reproduce the earlier table) replays the whole trace and measures the
evictions in the evaluation part.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's packages

from lpc.replay.ab import TRACE_CACHE_SIZES_TOKENS
from lpc.replay.ab_options import TRACE_MAX_MODEL_LEN
from lpc.replay.eviction_age import lru_eviction_ages
from lpc.replay.simulator import prepare
from lpc.traces.load import TraceOptions, load_trace
from lpc.traces.timeline import split_in_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake", help="trace file or bundled name")
    parser.add_argument("--split-at", type=float, default=0.5, help="as lpc ab --split-at")
    parser.add_argument(
        "--part",
        choices=("evaluation", "training"),
        default="evaluation",
        help="whose evictions are measured (training: the training part replayed alone)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    trace = load_trace(args.trace, TraceOptions(max_model_len=TRACE_MAX_MODEL_LEN))
    split = split_in_time(trace.requests, args.split_at)
    requests, counted = trace.requests, split.first_eval
    if args.part == "training":
        requests = trace.requests[: split.first_eval]
        middle = (requests[0].arrival_s + requests[-1].arrival_s) / 2
        counted = next(i for i, r in enumerate(requests) if r.arrival_s >= middle)
    workload = prepare(requests, trace.trace_block_size or 16, {}, first_counted=counted)
    rows = [lru_eviction_ages(workload, size).to_dict() for size in TRACE_CACHE_SIZES_TOKENS]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'cache tokens':>13} {'evictions':>10} {'p25 s':>8} {'median s':>9} {'p75 s':>8}")
    for r in rows:
        print(
            f"{r['cache_tokens']:>13,} {r['evictions']:>10,} {r['p25_s']:>8.0f} "
            f"{r['median_s']:>9.0f} {r['p75_s']:>8.0f}"
        )


if __name__ == "__main__":
    main()
