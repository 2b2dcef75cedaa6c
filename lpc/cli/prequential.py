"""`lpc prequential`: train before t, replay [t, t + Δ), for every t of a grid."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lpc.cli import extras
from lpc.cli.arg_types import positive_float, positive_int
from lpc.errors import CommandError

DESCRIPTION = """\
Prequential evaluation on a request trace: for each window [t, t + width), train the access
classifier and the return-time model on the requests before t (the shipped recipes), score
them on the window's releases, and replay the trace split at t and stopped at t + width (the
part before t warms the cache; hit ratios count the window only), with each policy's gain
over LRU and its 95 % paired bootstrap interval. Models are kept under --out/models and
reused on a rerun. See docs/results.md ("Prequential windows").
"""


def _seconds_list(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of seconds") from None
    if not values:
        raise argparse.ArgumentTypeError("no window start given")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    from lpc.cli.ab import _sizes

    p = subparsers.add_parser(
        "prequential",
        help="train before t, replay [t, t + width): every window of a trace",
        description=DESCRIPTION,
    )
    p.add_argument("--trace", default="mooncake", help="a request trace (default: %(default)s)")
    p.add_argument(
        "--starts",
        type=_seconds_list,
        default=None,
        help="window starts t, seconds after the first arrival (default: 1200,1800,2400,3000)",
    )
    p.add_argument(
        "--width",
        type=positive_float,
        default=None,
        help="window width Δ in seconds (default: 600)",
    )
    p.add_argument(
        "--policies",
        default=None,
        help="policies to replay (default: lru,lpc-pooled,lpc-return-km,lhd,wa,belady; lru "
        "is the baseline and must be among them)",
    )
    p.add_argument(
        "--cache-sizes",
        type=_sizes,
        default=None,
        help="cache sizes in tokens (default: 2.5M,4M,6M,8M,12M,16M)",
    )
    p.add_argument("--workers", type=positive_int, default=2, help="replay processes")
    p.add_argument("--out", type=Path, default=Path("results/prequential"))
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print every window as JSON")
    p.set_defaults(run=run)


def options_from(args: argparse.Namespace):
    from lpc.access.prequential import (
        DEFAULT_POLICIES,
        DEFAULT_STARTS_S,
        DEFAULT_WIDTH_S,
        PrequentialOptions,
        window_grid,
    )
    from lpc.errors import InvalidInputError
    from lpc.replay.policies import parse_policies
    from predictor.atomic_files import check_output_folder

    try:
        windows = window_grid(args.starts or DEFAULT_STARTS_S, args.width or DEFAULT_WIDTH_S)
        policies = tuple(parse_policies(args.policies or ",".join(DEFAULT_POLICIES)))
    except InvalidInputError as error:
        raise CommandError(str(error)) from None
    if "lru" not in {p.label for p in policies}:
        raise CommandError("--policies must include lru: every gain is measured against it")
    check_output_folder(args.out, "--out")  # before hours of windows, not after
    kwargs = {} if args.cache_sizes is None else {"cache_sizes_tokens": args.cache_sizes}
    return PrequentialOptions(
        trace=args.trace,
        windows=tuple(windows),
        policies=policies,
        out_dir=args.out,
        workers=args.workers,
        progress=not args.no_progress,
        **kwargs,
    )


def run(args: argparse.Namespace) -> int:
    extras.require("replay", "train")
    from lpc.access.prequential import run_prequential
    from lpc.access.prequential_report import markdown_report
    from predictor.atomic_files import (
        OutputWriteError,
        ResultsNotSavedError,
        write_text_atomically,
    )

    options = options_from(args)
    log = (lambda message: print(message, file=sys.stderr)) if args.json else print
    try:
        outcomes = run_prequential(options, log=log)
    except ResultsNotSavedError as error:  # the figures first, then the one-line error
        _print_windows([o.to_json() for o in error.results], args.json, error.written)
        raise
    windows = [o.to_json() for o in outcomes]
    written = [options.out_dir / "prequential.json"]
    report_path = options.out_dir / "report.md"
    try:
        write_text_atomically(report_path, markdown_report(windows))
    except OutputWriteError as error:
        _print_windows(windows, args.json, written)
        raise ResultsNotSavedError(outcomes, [error], written) from error
    _print_windows(windows, args.json, [*written, report_path])
    return 0


def _print_windows(windows: list[dict], as_json: bool, written: list[Path]) -> None:
    """The figures: the markdown report on the terminal, or the windows as JSON on stdout."""
    from lpc.access.prequential_report import markdown_report

    if as_json:
        json.dump(windows, sys.stdout, indent=2, default=str)
        print()
        return
    print(markdown_report(windows))
    print(f"files: {', '.join(map(str, written)) or 'none'}")
