"""`lpc bench <target>`: measured speed of the parts, printed and optionally as JSON."""

from __future__ import annotations

import argparse

from lpc.cli import (
    bench_access,
    bench_cache_policy,
    bench_evictor,
    bench_log,
    bench_predictor,
    bench_queue,
    bench_release,
    bench_step_scoring,
)

BENCH_MODULES = (
    bench_evictor,
    bench_cache_policy,
    bench_predictor,
    bench_access,
    bench_log,
    bench_release,
    bench_step_scoring,
    bench_queue,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmark a component", description=__doc__)
    targets = parser.add_subparsers(dest="target", metavar="<target>", required=True)
    for module in BENCH_MODULES:
        module.register(targets)
