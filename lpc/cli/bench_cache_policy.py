"""`lpc bench cache-policy`: ns per operation of our CPU-tier `CachePolicy` beside vLLM's."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_VLLM_PYTHON = Path(".vllm-venv/bin/python")


def register(targets: argparse._SubParsersAction) -> None:
    parser = targets.add_parser(
        "cache-policy",
        help="ns per operation: LPCCachePolicy and LPCPooledCachePolicy vs vLLM's lru and arc",
        description=(
            "Drives one seeded multi-turn chat plan through real vLLM's CPUOffloadingManager "
            "with each cache policy (vLLM's lru and arc, our LPCCachePolicy and "
            "LPCPooledCachePolicy), in vLLM's venv, a fresh process per policy and round; the "
            "calls the manager made are replayed and timed net of a no-op loop, best round "
            "kept. Reports ns per policy call and each policy's ratio to lru (target 1.5)."
        ),
    )
    parser.add_argument("--requests", type=int, default=2000, help="requests (default 2000)")
    parser.add_argument(
        "--chunks", type=int, default=2000, help="the CPU tier's chunks (default 2000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the plan")
    parser.add_argument("--runs", type=int, default=3, help="rounds, best kept (default 3)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed replays per process (default 3)"
    )
    parser.add_argument(
        "--vllm-python",
        type=Path,
        default=DEFAULT_VLLM_PYTHON,
        help="python of the vLLM venv (default .vllm-venv/bin/python)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from lpc.benchmarks import cache_policy_bench
    from lpc.errors import CommandError

    for flag in ("requests", "chunks", "runs", "repeats"):
        if getattr(args, flag) <= 0:
            raise CommandError(f"--{flag} must be positive, got {getattr(args, flag)}")
    if not args.vllm_python.exists():
        raise CommandError(
            f"no vLLM venv at {args.vllm_python}: run scripts/setup_vllm_venv.sh or pass "
            "--vllm-python"
        )
    result = cache_policy_bench.run(
        args.requests, args.chunks, args.seed, args.runs, args.vllm_python, args.repeats
    )
    if args.json:
        print(cache_policy_bench.to_json(result))
    else:
        print("\n".join(cache_policy_bench.summary_lines(result)))
    return 0
