"""`lpc bench evictor`: ns per free-queue operation for our evictors and vLLM's queue."""

from __future__ import annotations

import argparse
from pathlib import Path

from lpc.cli import extras

DEFAULT_VLLM_PYTHON = Path(".vllm-venv/bin/python")


def register(targets: argparse._SubParsersAction) -> None:
    parser = targets.add_parser(
        "evictor",
        help="ns per operation: our evictors (lru, lpc by default) vs vLLM's free queue",
        description=(
            "Drives our evictors (--policies; lru and lpc by default) through one seeded "
            "multi-turn chat plan (hits remove blocks, allocations pop them, finished turns "
            "release their chains; counted per block; the plan grows until every policy gets "
            "at least --ops), records each policy's calls, and replays them in a fresh process "
            "per implementation, --runs interleaved rounds, best kept; vLLM's "
            "FreeKVCacheBlockQueue replays the lru calls when its venv exists. Reports ns per "
            "block operation including the call that makes it (net of the replay loop) and the "
            "body alone (net of a no-op call too)."
        ),
    )
    parser.add_argument("--ops", type=int, default=1_000_000, help="block operations (default 1M)")
    parser.add_argument("--blocks", type=int, default=20_000, help="pool size (default 20000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the operation plan")
    parser.add_argument(
        "--runs",
        type=int,
        default=3,
        help="rounds, each a fresh process per implementation; the best is kept",
    )
    parser.add_argument(
        "--vllm-python",
        type=Path,
        default=DEFAULT_VLLM_PYTHON,
        help="python of the vLLM venv (default .vllm-venv/bin/python; skipped if missing)",
    )
    parser.add_argument(
        "--instructions",
        type=int,
        default=0,
        metavar="OPS",
        help="also count instructions per operation with valgrind's callgrind on an OPS-operation "
        "plan (e.g. 300000): a measure the machine's load cannot move (default: off)",
    )
    parser.add_argument(
        "--policies",
        default="lru,lpc",
        help="comma-separated policies to time, from the policy registry: "
        f"{', '.join(_timeable())} (default: lru,lpc; lru is always timed, as the baseline)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(run=run)


def _timeable() -> tuple[str, ...]:
    from lpc.benchmarks.evictor_worker import TIMEABLE_POLICIES

    return TIMEABLE_POLICIES


def run(args: argparse.Namespace) -> int:
    extras.require("replay")
    from lpc.benchmarks import evictor_bench
    from lpc.errors import CommandError

    for flag in ("ops", "blocks", "runs"):
        if getattr(args, flag) <= 0:
            raise CommandError(f"--{flag} must be positive, got {getattr(args, flag)}")
    policies = [name.strip() for name in args.policies.split(",") if name.strip()]
    unknown = [name for name in policies if name not in _timeable()]
    if unknown or not policies:
        raise CommandError(
            f"--policies: cannot time {', '.join(unknown) or 'nothing'}; "
            f"choose from {', '.join(_timeable())}"
        )
    if args.instructions < 0:
        raise CommandError(f"--instructions must be >= 0, got {args.instructions}")
    if args.instructions:
        from lpc.benchmarks.instruction_count import valgrind_available

        if not valgrind_available():
            raise CommandError("--instructions needs valgrind (apt-get install valgrind)")
    result = evictor_bench.run(
        args.ops,
        args.blocks,
        args.seed,
        args.runs,
        args.vllm_python,
        args.instructions,
        progress=not args.no_progress,
        policies=policies,
    )
    if args.json:
        print(evictor_bench.to_json(result))
    else:
        print("\n".join(evictor_bench.summary_lines(result)))
    return 0
