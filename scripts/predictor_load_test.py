"""Load test of `lpc serve`: many concurrent clients against the real server, every answer checked.

Starts `lpc serve` on a free loopback port (a child process), computes the expected
probability of every window in this process with the same artifact and embedder, then runs
--clients closed-loop clients for --duration-s. Passes when no request is lost or mis-answered,
every refusal is a 503 "overloaded", and the server is healthy afterwards. Prints a JSON
report; exit status 0 on pass, 1 on fail.

    python scripts/predictor_load_test.py --clients 64 --duration-s 30 --max-queue 32

Mixed request sizes, the load admission by work is for (the server learns its speed on
short windows first, then gets 1-8 windows of 512 tokens per request):

    python scripts/predictor_load_test.py --source worst --max-items-per-request 8 \
        --max-queue 256 --warmup-s 10

Without --artifact an untrained MLP is used (what is tested is the serving path, not the
model). Real embedders batch with tiny float differences (~1e-7) depending on what shares a
batch, so answers are compared with --tolerance (default 1e-5); the pytest version with a
deterministic embedder compares exactly.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predictor.runtime import prefer_passive_openmp

prefer_passive_openmp()  # before torch is imported: see predictor/runtime.py

from lpc.benchmarks.serve_load_test import (  # noqa: E402
    ServeLoadTestOptions,
    run_serve_load_test,
)
from predictor.atomic_files import write_text_atomically  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument(
        "--max-requests",
        type=int,
        default=None,
        help="stop after this many requests even before --duration-s",
    )
    parser.add_argument("--embedder", default="e5-small-q4")
    parser.add_argument("--artifact", type=Path, default=None)
    parser.add_argument("--windows", type=int, default=256, help="distinct windows cycled")
    parser.add_argument(
        "--windows-file", type=Path, default=None, help="JSONL windows (overrides --source)"
    )
    parser.add_argument(
        "--source",
        choices=["sharegpt", "synthetic", "worst"],
        default="sharegpt",
        help="sharegpt: user-turn windows sampled from the bundled ShareGPT "
        "file (through training.loaders); synthetic: chat-like random "
        "windows; worst: windows that fill the 512-token budget",
    )
    parser.add_argument(
        "--items-per-request", type=int, default=1, help="windows per request (the fewest)"
    )
    parser.add_argument(
        "--max-items-per-request",
        type=int,
        default=None,
        help="draw each request's window count uniformly from --items-per-request to this",
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=0.0,
        help="first run this long with short single-window requests (first turns of a few "
        "words, 4 clients), "
        "so the server has learned its speed on short windows when the load starts",
    )
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=0.0)
    parser.add_argument(
        "--max-queue",
        type=int,
        default=32,
        help="server queue bound; below --clients so 503s are exercised",
    )
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        default=30.0,
        help="server --request-timeout-s (a request whose estimated wait exceeds half of "
        "it is refused with 503 at once)",
    )
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--output", type=Path, default=None, help="also write the report here")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    options = ServeLoadTestOptions(**{k: v for k, v in vars(args).items() if k != "output"})
    result = run_serve_load_test(options)
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.output:
        write_text_atomically(args.output, text + "\n")  # printed above whatever happens
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
