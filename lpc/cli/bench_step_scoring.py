"""`lpc bench step-scoring`: the in-process access model's cost per scheduler step."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from lpc.cli.arg_types import positive_int


def register(targets: argparse._SubParsersAction) -> None:
    parser = targets.add_parser(
        "step-scoring",
        help="the access model per scheduler step: one call for the step against one per request",
        description=(
            "Times the in-process access model for the requests one scheduler step finishes: "
            "one forward pass for all of them (what the LPC scheduler class runs at the "
            "step's end) against one per request (a release scored alone), with vLLM-like "
            "requests, the shipped access model and its conversation table; each side reads "
            "and records every request, steps interleaved. p50 per step over the steps. "
            "Timer: the thread's CPU time."
        ),
    )
    parser.add_argument(
        "--model", type=Path, help="access-only artifact folder (default: the shipped one)"
    )
    parser.add_argument(
        "--finished",
        default="1,2,4,16,64",
        help="requests a step finishes, comma-separated (default 1,2,4,16,64)",
    )
    parser.add_argument("--steps", type=positive_int, default=200, help="steps per size (200)")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="read a 32 MiB buffer before each step: the model and table from memory",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(run=run)


def _finished(text: str) -> tuple[int, ...]:
    from lpc.errors import CommandError

    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise CommandError(f"--finished must be comma-separated counts, got {text!r}") from None
    if any(count < 1 for count in counts):
        raise CommandError(f"--finished: every count must be at least 1, got {text!r}")
    return counts


def run(args: argparse.Namespace) -> int:
    from lpc.benchmarks import step_scoring_bench
    from lpc.errors import CommandError
    from lpc.integrations.config import PluginConfigError
    from training.locations import SHIPPED_ACCESS_MODEL_NAME, shipped_model_dir

    counts = _finished(args.finished)
    model = args.model or shipped_model_dir(SHIPPED_ACCESS_MODEL_NAME)
    if model is None:
        raise CommandError("no access-only model: pass --model FOLDER")
    try:
        figures = step_scoring_bench.run(
            model,
            counts,
            args.steps,
            cold=args.cold,
            progress=None if args.json else lambda line: print(line, file=sys.stderr),
        )
    except (PluginConfigError, ValueError) as error:
        raise CommandError(str(error)) from None
    if args.json:
        print(json.dumps({"cold": args.cold, "figures": [asdict(f) for f in figures]}, indent=2))
        return 0
    print("finished/step  one by one (µs)  one call (µs)  ratio  per request (µs)  model calls")
    for f in figures:
        print(
            f"{f.finished:13d}  {f.one_by_one_us:15.1f}  {f.one_call_us:13.1f}  {f.ratio:5.2f}"
            f"  {f.one_call_per_request_us:16.1f}  {f.calls_one_by_one} -> {f.calls_one_call}"
        )
    return 0
