"""`lpc bench log`: what the request log costs the release path, and the writer's rate."""

from __future__ import annotations

import argparse
import json


def register(targets: argparse._SubParsersAction) -> None:
    parser = targets.add_parser(
        "log",
        help="µs per finished request the request log adds, and records/s its writer keeps up",
        description=(
            "Replays one synthetic multi-turn chat workload (LRU, our block manager) without a "
            "request log and with one, best of --repeats; during the logged replay the writer "
            "thread is held, so the difference is what the releasing thread pays per finished "
            "request (building the record, a non-blocking queue put). The held writer is then "
            "let go and timed draining the queue (keyed block ids, JSON, disk): records per "
            "second. Also times the vLLM plugin's own record path on vLLM-like requests, and a "
            "replay with the writer running alongside. Targets: <= 5 µs per request, >= 10,000 "
            "records/s."
        ),
    )
    parser.add_argument(
        "--conversations", type=int, default=5000, help="chats in the workload (default 5000)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds, best kept (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from lpc.benchmarks.log_bench import run_log_bench, summary_lines
    from lpc.errors import CommandError

    for flag in ("conversations", "repeats"):
        if getattr(args, flag) <= 0:
            raise CommandError(f"--{flag} must be positive, got {getattr(args, flag)}")
    result = run_log_bench(args.conversations, args.repeats, args.seed)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print("\n".join(summary_lines(result)))
    return 0
