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
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from predictor.runtime import prefer_passive_openmp  # noqa: E402

prefer_passive_openmp()  # before torch is imported: see predictor/runtime.py

from lpc.benchmarks.predictor_bench import sharegpt_windows  # noqa: E402
from predictor.atomic_files import write_text_atomically  # noqa: E402
from predictor.benchmark import (  # noqa: E402
    synthetic_windows,
    untrained_artifact,
    worst_case_windows,
)
from predictor.embedders import load_embedder  # noqa: E402
from predictor.features import ConversationWindow  # noqa: E402
from predictor.load_test import LoadTestConfig, run_load_test  # noqa: E402
from predictor.predictor import Predictor  # noqa: E402
from predictor.server_process import ServerProcess, free_port, lpc_serve_command  # noqa: E402
from predictor.windows_file import read_windows_jsonl  # noqa: E402


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


def short_windows(count: int) -> list[ConversationWindow]:
    """First turns of at most 8 words: what a server that just started mostly sees."""
    return [
        ConversationWindow(f"warmup-{i}", (" ".join(w.user_prompts[-1].split()[:8]),), 1)
        for i, w in enumerate(synthetic_windows(count, seed=1))
    ]


def metric_value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> int:
    args = parse_args()
    if args.windows_file:
        windows = read_windows_jsonl(args.windows_file, args.windows)
    elif args.source == "worst":
        windows = worst_case_windows(args.windows)
    elif args.source == "synthetic":
        windows = synthetic_windows(args.windows)
    else:
        windows, _ = sharegpt_windows(args.windows, 3000, seed=0)
    embedder = load_embedder(args.embedder)
    with tempfile.TemporaryDirectory(prefix="lpc-load-test-") as scratch:
        artifact = args.artifact or untrained_artifact(
            Path(scratch) / "untrained", embedder, args.embedder
        )
        print(f"expected answers for {len(windows)} windows (in process)", file=sys.stderr)
        reference = Predictor.load(artifact, embedder=embedder)
        expected = reference.predict(windows)
        warmup_windows = short_windows(64) if args.warmup_s > 0 else []
        warmup_expected = reference.predict(warmup_windows) if warmup_windows else None
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = lpc_serve_command(
            artifact,
            args.embedder,
            port,
            *("--max-batch", str(args.max_batch)),
            *("--max-wait-ms", str(args.max_wait_ms)),
            *("--max-queue", str(args.max_queue)),
            *("--request-timeout-s", str(args.request_timeout_s)),
        )
        env = {
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
            )
        }
        log = Path(scratch) / "server.log"
        print(f"starting {' '.join(command[1:])}", file=sys.stderr)
        with ServerProcess(command, url, log_path=log, env=env) as server:
            warmup = None
            if warmup_windows:
                print(f"warm-up: short windows for {args.warmup_s} s", file=sys.stderr)
                warmup = run_load_test(
                    LoadTestConfig(
                        url, clients=4, duration_s=args.warmup_s, tolerance=args.tolerance
                    ),
                    warmup_windows,
                    warmup_expected,
                )
            print(f"{args.clients} clients for {args.duration_s} s", file=sys.stderr)
            report = run_load_test(
                LoadTestConfig(
                    url,
                    clients=args.clients,
                    duration_s=args.duration_s,
                    max_requests=args.max_requests,
                    items_per_request=args.items_per_request,
                    max_items_per_request=args.max_items_per_request,
                    tolerance=args.tolerance,
                ),
                windows,
                expected,
            )
            import httpx

            metrics = httpx.get(url + "/metrics", timeout=10).text
            rss = server.peak_rss_mb()
            started = time.monotonic()
            exit_code = server.stop()
            stop_s = time.monotonic() - started
        overloaded_metric = metric_value(metrics, 'lpc_predictor_errors_total{kind="overloaded"}')
        warmup_overloaded = warmup.overloaded_503 if warmup else 0
        warmup_passed = warmup is None or warmup.passed
        result = {
            "passed": warmup_passed
            and report.passed
            and overloaded_metric == report.overloaded_503 + warmup_overloaded,
            "server": {
                "command": " ".join(command[1:]),
                "peak_rss_mb": rss,
                "overloaded_counted_by_server": overloaded_metric,
                "stop_seconds": round(stop_s, 2),
                "exit_code": exit_code,
                "log_tail": log.read_text(errors="replace")[-1500:],
            },
            "embedder_id": embedder.embedder_id,
            "windows": len(windows),
            "source": str(args.windows_file or args.source),
            "load_average_1m": os.getloadavg()[0],
            "warmup": warmup.as_dict() if warmup else None,
            "report": report.as_dict(),
        }
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.output:
        write_text_atomically(args.output, text + "\n")  # printed above whatever happens
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
