"""`lpc bench predictor`: embedder alone, Predictor in process, and the RPC server under load."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lpc.benchmarks.predictor_bench import SETS, PredictorBenchOptions
from lpc.cli import extras


def register(targets: argparse._SubParsersAction) -> None:
    parser = targets.add_parser(
        "predictor",
        help="predictions/s and latency: embedder, in-process Predictor, RPC under load",
        description=(
            "Measures three layers on the same windows: the embedder alone (batched texts/s, "
            "single-text latency), Predictor.predict in process (single-window latency, "
            "batched throughput), and a real `lpc serve` child process (sequential "
            "single-window latency, hence the RPC overhead; then --rpc-clients concurrent "
            "clients for --rpc-duration-s: predictions/s, latency percentiles, 503s) plus the "
            "server's peak RSS. Window sets: 'paper' (user-prompt windows sampled from the "
            "bundled ShareGPT file through the training loaders, or --windows-file) and "
            "'worst' (synthetic windows whose text fills the 512-token budget); 'stream' "
            "(every turn of the first --stream-conversations multi-turn ShareGPT "
            "conversations, in order, one call each: in-process only, the set that shows the "
            "prompt cache of --feature-mode prompt_mean). Without --artifact an untrained MLP "
            "is used: speed does not depend on its weights."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_window_arguments(parser)
    _add_subject_arguments(parser)
    parser.set_defaults(run=run)


def _add_window_arguments(parser: argparse.ArgumentParser) -> None:
    """The window sets measured and where their windows come from."""
    parser.add_argument(
        "--sets", default="paper,worst", help="comma-separated window sets: paper, worst, stream"
    )
    parser.add_argument(
        "--windows-file",
        type=Path,
        default=None,
        help="JSONL windows for the 'paper' set instead of ShareGPT",
    )
    parser.add_argument("--paper-windows", type=int, default=96, help="windows in 'paper'")
    parser.add_argument("--worst-windows", type=int, default=32, help="windows in 'worst'")
    parser.add_argument(
        "--sharegpt-conversations",
        type=int,
        default=3000,
        help="ShareGPT conversations read to sample 'paper' windows from",
    )
    parser.add_argument(
        "--stream-conversations",
        type=int,
        default=30,
        help="multi-turn ShareGPT conversations in 'stream'",
    )
    parser.add_argument(
        "--feature-mode",
        choices=["joined", "prompt_mean"],
        default="joined",
        help="window encoding of the untrained artifact (ignored with "
        "--artifact, which carries its own)",
    )


def _add_subject_arguments(parser: argparse.ArgumentParser) -> None:
    """What is measured (embedder, artifact) and how hard: batches, calls, server load."""
    parser.add_argument("--embedder", default="e5-small-q4", help="embedder spec")
    parser.add_argument(
        "--artifact",
        "--model",
        dest="artifact",
        type=Path,
        default=None,
        help="trained artifact folder (--model is the same flag; default: an untrained MLP, "
        "speed only)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=8, help="texts per embedder call in the batched stages"
    )
    parser.add_argument(
        "--single-count", type=int, default=16, help="windows timed one call each (latency stages)"
    )
    parser.add_argument("--no-rpc", action="store_true", help="skip the server stages")
    parser.add_argument(
        "--rpc-clients",
        type=int,
        default=16,
        help="concurrent closed-loop clients in the load stage",
    )
    parser.add_argument(
        "--rpc-duration-s", type=float, default=20.0, help="length of the load stage per window set"
    )
    parser.add_argument("--server-max-batch", type=int, default=32, help="server --max-batch")
    parser.add_argument(
        "--server-max-wait-ms", type=float, default=0.0, help="server --max-wait-ms"
    )
    parser.add_argument("--server-max-queue", type=int, default=256, help="server --max-queue")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads, here and in the server (default: torch's)",
    )
    parser.add_argument("--seed", type=int, default=0, help="window sampling seed")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    """Check the flags, measure (`lpc.benchmarks.predictor_bench`), print the figures."""
    extras.require("serve")  # the text predictor and its RPC server
    from lpc.benchmarks.predictor_bench import run_predictor_bench
    from lpc.benchmarks.predictor_report import print_table
    from predictor.runtime import prefer_passive_openmp

    openmp = prefer_passive_openmp()  # before torch is imported: see predictor/runtime.py
    result = run_predictor_bench(options_from(args), openmp)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print_table(result)
    return 0


def options_from(args: argparse.Namespace) -> PredictorBenchOptions:
    """The parsed flags as `PredictorBenchOptions`, every value checked."""
    return PredictorBenchOptions(
        sets=tuple(checked_sets(args)),
        windows_file=args.windows_file,
        paper_windows=args.paper_windows,
        worst_windows=args.worst_windows,
        sharegpt_conversations=args.sharegpt_conversations,
        stream_conversations=args.stream_conversations,
        feature_mode=args.feature_mode,
        embedder=args.embedder,
        artifact=args.artifact,
        batch_size=args.batch_size,
        single_count=args.single_count,
        rpc=not args.no_rpc,
        rpc_clients=args.rpc_clients,
        rpc_duration_s=args.rpc_duration_s,
        server_max_batch=args.server_max_batch,
        server_max_wait_ms=args.server_max_wait_ms,
        server_max_queue=args.server_max_queue,
        threads=args.threads,
        seed=args.seed,
    )


def checked_sets(args: argparse.Namespace) -> list[str]:
    """The chosen window sets; bad flags are refused before anything slow loads. --threads
    is applied here, before any stage builds a thread pool."""
    import torch

    from lpc.errors import CommandError

    if args.threads is not None:
        if args.threads < 1:
            raise CommandError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    unknown = sorted(set(sets) - set(SETS))
    if unknown or not sets:
        raise CommandError(f"--sets: unknown set(s) {unknown}; choose from {SETS}")
    for flag in (
        "paper_windows",
        "worst_windows",
        "batch_size",
        "single_count",
        "rpc_clients",
        "stream_conversations",
    ):
        if getattr(args, flag) <= 0:
            raise CommandError(
                f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}"
            )
    return sets
