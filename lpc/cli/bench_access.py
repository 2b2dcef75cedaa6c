"""`lpc bench access`: the access-only predictor's speed in process, and its training time."""

from __future__ import annotations

import argparse
from pathlib import Path

from lpc.cli import extras


def register(targets: argparse._SubParsersAction) -> None:
    parser = targets.add_parser(
        "access",
        help="access-only predictor: load time, requests/s batched, µs for one request",
        description=(
            "Loads the access-only artifact (default: the shipped models/mooncake-access) 20 "
            "times, then measures the batched numpy forward pass over --requests feature rows "
            "in batches of --batch-size, one request at a time from an engine's state "
            "(features + forward pass), and features for a 20,000-row request table. With "
            "--train-trace it also times `lpc train --trace TRACE` in a fresh process."
        ),
    )
    parser.add_argument("--model", type=Path, help="access-only artifact folder")
    parser.add_argument(
        "--requests", type=int, default=200_000, help="rows for the batched figure (default 200000)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=1024, help="rows per forward pass (default 1024)"
    )
    parser.add_argument(
        "--single", type=int, default=20_000, help="one-request calls timed (default 20000)"
    )
    parser.add_argument(
        "--train-trace",
        metavar="TRACE",
        help="also time `lpc train --trace TRACE --out DIR` end to end (e.g. mooncake)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    extras.require("train")  # pandas and threadpoolctl; --train-trace fits the model
    from lpc.benchmarks import access_bench
    from lpc.errors import CommandError
    from predictor.artifact import ArtifactError
    from training.locations import SHIPPED_ACCESS_MODEL_NAME, shipped_model_dir

    for flag in ("requests", "batch_size", "single"):
        if getattr(args, flag) <= 0:
            name = flag.replace("_", "-")
            raise CommandError(f"--{name} must be positive, got {getattr(args, flag)}")
    model = args.model or shipped_model_dir(SHIPPED_ACCESS_MODEL_NAME)
    if model is None:
        raise CommandError("no access-only model: pass --model FOLDER")
    try:
        result = access_bench.run(
            model, args.requests, args.batch_size, args.single, args.train_trace
        )
    except ArtifactError as error:
        raise CommandError(str(error)) from None
    if args.json:
        print(result.to_json())
    else:
        print("\n".join(access_bench.summary_lines(result)))
    return 0
