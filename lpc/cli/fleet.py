"""`lpc fleet`: many engine instances behind a router, replayed router × policy × size."""

from __future__ import annotations

import argparse
from pathlib import Path

from lpc.cli.ab import _sizes
from lpc.cli.arg_types import positive_float, positive_int, split_at

DESCRIPTION = """\
Replay a fleet: N engine instances, each with its own prefix cache of --cache-sizes tokens and
one eviction policy, behind a router (round-robin, least-loaded by queued tokens,
session-sticky with rebalancing, prefix-aware with ties broken by load). A trace is scaled to
a fleet of k copies (k = the instance count unless --copies): each copy's block ids are
offset so copies share no block, and its arrivals are shifted by a fraction of a gap
(docs/design.md, "The fleet"); the ShareGPT workload (--trace none) is scaled by k times its
active conversations. The workload, the probabilities, the return curves and the
fitted constants are those `lpc ab --trace` builds, so one instance under any router gives its
figures exactly. Reports per router × policy × instance count × size the fleet token hit ratio
with its 95 % interval, the gain over LRU under the same router (paired interval), the load
balance (busiest instance's prompt tokens over the mean) and the TTFT of the latency model;
writes fleet.json, fleet.csv, report.md and fleet.png to --out.

With --ray the replays run as Ray tasks (pip install 'lpc[ray]'): locally with --workers CPUs,
or on the cluster at --ray-address; the figures equal the serial run's.
"""

DEFAULT_POLICIES = "lru,s3fifo,lpc-pooled,lpc-return-model"
DEFAULT_ROUTERS = "round-robin,least-loaded,session-sticky,prefix-aware"


def _counts(text: str) -> tuple[int, ...]:
    values = tuple(dict.fromkeys(positive_int(p.strip()) for p in text.split(",") if p.strip()))
    if not values:
        raise argparse.ArgumentTypeError("no instance count given")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "fleet",
        help="fleet replay: routers × policies × instance counts",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_workload_args(p.add_argument_group("workload"))
    _add_fleet_args(p.add_argument_group("fleet"))
    _add_output_args(p.add_argument_group("execution and output"))
    p.set_defaults(run=run_command)


def _add_workload_args(data: argparse._ArgumentGroup) -> None:
    data.add_argument(
        "--trace",
        default="mooncake",
        help="request trace to scale to the fleet: 'mooncake' (bundled; default) or a "
        "Mooncake-format JSONL file; 'none' generates the ShareGPT workload instead "
        "(--dataset, --think-time, --max-active)",
    )
    data.add_argument(
        "--copies",
        type=positive_int,
        default=None,
        help="the fleet's traffic is k copies of the trace merged (with --trace none: k times "
        "--max-active, i.e. k times the rate); default: k = the instance count",
    )
    data.add_argument(
        "--split-at",
        type=split_at,
        default=None,
        help="the training part ends here: a fraction of the span or seconds (default: 0.5)",
    )
    data.add_argument(
        "--dataset",
        default="sharegpt",
        help="with --trace none: the conversations (default: %(default)s)",
    )
    data.add_argument(
        "--think-time",
        type=positive_float,
        default=100.0,
        help="with --trace none: mean user think time in seconds (default: %(default)s)",
    )
    data.add_argument(
        "--max-active",
        type=positive_int,
        default=200,
        help="with --trace none: at most this many active conversations; raise it for a "
        "higher rate (default: %(default)s)",
    )
    data.add_argument(
        "--duration",
        type=positive_float,
        default=1200.0,
        help="with --trace none: window in seconds (default: %(default)s)",
    )


def _add_fleet_args(fleet: argparse._ArgumentGroup) -> None:
    fleet.add_argument(
        "--instances",
        type=_counts,
        default=(1, 4),
        help="instance counts, e.g. 1,4,16 (default: 1,4)",
    )
    fleet.add_argument(
        "--routers",
        default=DEFAULT_ROUTERS,
        help=f"routers (default: {DEFAULT_ROUTERS})",
    )
    fleet.add_argument(
        "--policies",
        default=DEFAULT_POLICIES,
        help=f"eviction policies, as `lpc ab --policies` (default: {DEFAULT_POLICIES})",
    )
    fleet.add_argument(
        "--cache-sizes",
        type=_sizes,
        default=(4_000_000,),
        help="cache size of each instance in tokens: a list (4M,8M) or a range (default: 4M)",
    )
    fleet.add_argument(
        "--model",
        help="access-feature predictor for lpc-pooled (default: the shipped "
        "models/mooncake-access)",
    )
    fleet.add_argument(
        "--return-model",
        type=Path,
        default=None,
        help="return-time artifact for lpc-return-model (default: the shipped "
        "models/mooncake-return)",
    )


def _add_output_args(run: argparse._ArgumentGroup) -> None:
    run.add_argument(
        "--ray", action="store_true", help="run the replays as Ray tasks (needs lpc[ray])"
    )
    run.add_argument(
        "--ray-address",
        help="with --ray: the cluster to run on (ray://host:10001, or 'auto'); default: a "
        "local Ray with --workers CPUs",
    )
    run.add_argument(
        "--workers",
        type=positive_int,
        default=2,
        help="with --ray: CPUs of the local Ray (default: %(default)s)",
    )
    run.add_argument(
        "--out",
        type=Path,
        default=Path("results/fleet"),
        help="folder for fleet.json, fleet.csv, report.md, fleet.png and the scaled traces "
        "(default: %(default)s)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.add_argument("--json", action="store_true", help="print all figures as JSON")


def options_from(args: argparse.Namespace):
    """The fleet's options, every flag checked before anything is loaded."""
    from lpc.cli.ab import check_out_dir
    from lpc.errors import CommandError, InvalidInputError
    from lpc.fleet.fanout import Executor
    from lpc.fleet.pipeline import FleetOptions
    from lpc.fleet.routers import ROUTERS
    from lpc.replay.ab_options import ABOptions
    from lpc.replay.policies import parse_policies
    from lpc.traces.jsonl import TraceError
    from lpc.traces.load import resolve_trace
    from lpc.workload import WorkloadConfig

    try:
        policies = tuple(parse_policies(args.policies))
    except InvalidInputError as error:
        raise CommandError(f"--policies: {error}") from None
    routers = tuple(dict.fromkeys(r.strip() for r in args.routers.split(",") if r.strip()))
    unknown = [r for r in routers if r not in ROUTERS]
    if unknown or not routers:
        raise CommandError(
            f"--routers: unknown router {unknown[0] if unknown else '(none)'!r}; choose from "
            f"{', '.join(ROUTERS)}"
        )
    trace = None if args.trace == "none" else Path(args.trace)
    if trace is not None:
        try:
            resolve_trace(trace)
        except TraceError as error:
            raise CommandError(f"--trace: {error}") from None
    if any(p.evictor == "belady" for p in policies) and max(args.instances) > 1:
        raise CommandError("belady needs each instance's own future: run it with --instances 1")
    if args.ray_address and not args.ray:
        raise CommandError("--ray-address goes with --ray")
    check_out_dir(args.out)
    workload = WorkloadConfig(args.think_time, args.max_active, args.duration)
    ab = ABOptions(
        dataset=args.dataset,
        trace=trace,
        split_at=args.split_at,
        policies=policies,
        cache_sizes_tokens=args.cache_sizes,
        workload=workload,
        progress=not args.no_progress,
        return_model=args.return_model,
        out_dir=args.out,
    )
    executor = Executor("ray" if args.ray else "serial", args.ray_address, args.workers)
    return FleetOptions(
        ab,
        instance_counts=args.instances,
        routers=routers,
        copies=args.copies,
        executor=executor,
        out_dir=args.out,
        progress=not args.no_progress,
    )


def _model_factory(args: argparse.Namespace, options, log):
    """The probability source of lpc / lpc-pooled: the access-feature model on a trace (the
    shipped one unless --model), the text model on a generated workload."""
    from dataclasses import replace

    from lpc.cli import extras
    from lpc.cli.ab import _is_access_model, model_path_from
    from lpc.errors import CommandError

    if not any(p.source == "model" for p in options.ab.policies):
        return options, None
    model = model_path_from(argparse.Namespace(model=args.model, trace=options.ab.trace))
    if model is None:
        learned = next(p.label for p in options.ab.policies if p.source == "model")
        raise CommandError(f"policy {learned!r} needs a trained predictor model (--model PATH)")
    if _is_access_model(model):
        from lpc.access.source import access_source_factory

        options = replace(options, ab=replace(options.ab, model_reads_text=False))
        return options, access_source_factory(model, log=log)
    extras.require("text")
    from lpc.replay.learned_source import learned_source_factory
    from training.embedding_cache import EmbedOptions
    from training.locations import default_embedding_cache_dir

    factory = learned_source_factory(
        model, default_embedding_cache_dir(), EmbedOptions(progress=options.progress), log=log
    )
    return options, factory


def run_command(args: argparse.Namespace) -> int:
    import json
    import sys

    from lpc.cli import extras

    extras.require("replay", "data")
    from lpc.fleet.pipeline import run_fleet, summary_text

    options = options_from(args)
    log = (lambda message: print(message, file=sys.stderr)) if args.json else print
    options, factory = _model_factory(args, options, log)
    outcome = run_fleet(options, factory, log)
    if args.json:
        print(json.dumps(outcome.to_json(), indent=2, default=str))
        return 0
    print()
    print(summary_text(outcome))
    print()
    print(f"total {outcome.timings_s['total_s']:.1f} s; files: {', '.join(outcome.files.values())}")
    return 0
