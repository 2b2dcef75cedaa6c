"""`lpc ab`: replay chats (or a request trace) through the block manager, policy by policy."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from lpc.cli import extras
from lpc.cli.ab_tiers import add_tier_arguments, tier_settings_from
from lpc.cli.arg_types import positive_float, positive_int, split_at
from lpc.replay.ab import DEFAULT_CACHE_SIZES_TOKENS, TRACE_CACHE_SIZES_TOKENS
from lpc.replay.policies import policy_help

if TYPE_CHECKING:
    from collections.abc import Callable

    from lpc.replay.ab_options import ABOptions, ModelSourceFactory
    from lpc.replay.ab_report import ABOutcome
    from lpc.replay.policies import PolicySpec

DESCRIPTION = """\
Replay a chat workload through the prefix-caching block manager once per eviction policy and
cache size, on one identical trace, and report token hit ratios the way the LPC paper does:
relative gain over LRU, the share of the LRU→oracle gap closed, and the cache size each policy
needs to match LRU's hit ratio. By default the workload is the paper's: the evaluation half of
the bundled ShareGPT (never trained on), exponential think times (mean 100 s), at most 200
active conversations, a 20-minute window. Writes a table to the terminal and CSV, markdown,
JSON and PNG plots to --out.

With --trace it replays a request trace instead: a production trace (Mooncake, Alibaba
Bailian; `--trace mooncake` is the bundled one hour of Kimi chat traffic) or the project's own
JSONL format. The cache warms up on the trace's first part (--split-at) and hit ratios count
the rest; completion times come from the latency model, the oracle's label from --horizon.
Formats, prefix linkage and errors: docs/traces.md.
"""

POLICY_HELP = policy_help()  # built from the policy registry


def _sizes(text: str) -> tuple[int, ...]:
    """`60000,80000`, `2M,4M` or `60K:160K:20K` (start:stop:step, inclusive)."""

    def tokens(part: str) -> int:
        part = part.strip().upper()
        scale = {"K": 1000, "M": 1_000_000}.get(part[-1:], 1)
        try:
            value = int(float(part.rstrip("KM")) * scale)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a size in tokens") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"cache sizes must be > 0, got {part}")
        return value

    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise argparse.ArgumentTypeError("a range is start:stop:step, e.g. 60K:160K:20K")
        start, stop, step = (tokens(p) for p in parts)
        if stop < start:
            raise argparse.ArgumentTypeError(f"range stop {stop} is below its start {start}")
        return tuple(range(start, stop + 1, step))
    values = tuple(sorted({tokens(p) for p in text.split(",") if p.strip()}))
    if not values:
        raise argparse.ArgumentTypeError("no cache size given")
    return values


def _size_text(sizes: tuple[int, ...]) -> str:
    return ",".join(f"{s / 1e6:g}M" if s >= 1_000_000 else f"{s / 1000:g}K" for s in sizes)


def _scale(text: str) -> float | None:
    """A positive number, or 'auto' (None): 1 / the workload's mean observed think time."""
    return None if text == "auto" else positive_float(text)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(positive_float(p) for p in text.split(",") if p.strip())


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ab",
        help="A/B hit-ratio replay of eviction policies",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_data_arguments(p)
    _add_workload_arguments(p)
    _add_policy_arguments(p)
    _add_sweep_arguments(p)
    add_tier_arguments(p, _sizes)
    _add_output_arguments(p)
    p.set_defaults(run=run)


def _add_data_arguments(p: argparse.ArgumentParser) -> None:
    """Where the requests come from: a chat data set or a request trace."""
    data = p.add_argument_group("data")
    data.add_argument(
        "--dataset",
        default="sharegpt",
        help="conversations: 'sharegpt' (bundled), a local file or folder (ShareGPT, LMSys, "
        "Chatbot-Arena or OpenAI messages JSON/JSONL/Parquet), or hf:<id>[:split] "
        "(default: sharegpt)",
    )
    data.add_argument(
        "--format",
        dest="data_format",
        choices=["sharegpt", "lmsys", "arena", "openai"],
        help="data format (default: recognised from the records)",
    )
    data.add_argument(
        "--mode",
        help="ShareGPT: separate (default; each item its own conversation) or merge; "
        "Arena: a (default) or both",
    )
    data.add_argument(
        "--trace",
        type=Path,
        help="replay this request trace instead of generating a workload: a JSONL file (gzip "
        "or plain; Mooncake, Bailian or lpc format), a folder of lpc files (the serving plugin's "
        "request logs, merged by time) or a bundled trace, 'mooncake' (the Mooncake "
        "conversation trace) or 'mooncake-synthetic' (docs/traces.md)",
    )
    data.add_argument(
        "--trace-format",
        choices=["mooncake", "bailian", "lpc"],
        help="format of --trace (default: recognised from its first line)",
    )
    data.add_argument(
        "--split-at",
        type=split_at,
        default=None,
        help="with --trace: requests before this point are the training part (they warm the "
        "cache and fit lpc-turns, wa and session-ref), the rest are counted; a fraction of the "
        "trace's span (< 1) or seconds after its first arrival; 0 counts every request "
        "(default: 0.5)",
    )
    data.add_argument(
        "--horizon",
        type=positive_float,
        default=1800.0,
        help="with an imported --trace: the oracle's label is 'this conversation's next "
        "request arrives within this many seconds of completion' (default: %(default)s)",
    )
    data.add_argument(
        "--shared-fanout",
        type=positive_int,
        default=8,
        help="Mooncake prefix linkage: a block followed by this many distinct blocks is a "
        "shared system prompt or document and links nothing (default: %(default)s)",
    )
    data.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="cut conversations (or trace requests, with a warning) at this many tokens "
        "(default: 32768; 131072 for a --trace)",
    )


def _add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The generated workload: the paper's think times, window and latency model."""
    work = p.add_argument_group("workload (the paper's method)")
    work.add_argument(
        "--think-time",
        "--lambda-chat",
        dest="think_time",
        type=positive_float,
        default=100.0,
        help="mean user think time λ_chat in seconds (default: %(default)s)",
    )
    work.add_argument(
        "--max-active",
        type=positive_int,
        default=200,
        help="at most this many active conversations, N_conv (default: %(default)s)",
    )
    work.add_argument(
        "--duration",
        default="1200",
        help="window in seconds, or 'all' to replay every evaluation conversation "
        "(default: %(default)s)",
    )
    work.add_argument(
        "--seed", type=int, default=0, help="seed of the workload (default: %(default)s)"
    )
    work.add_argument(
        "--closed-loop",
        action="store_true",
        help="prefill time depends on uncached tokens (each policy then sees its own "
        "timeline; no belady)",
    )
    work.add_argument(
        "--prefill-tokens-per-s",
        type=positive_float,
        default=8000.0,
        help="latency model: prefill speed (default: %(default)s)",
    )
    work.add_argument(
        "--time-per-output-token",
        type=float,
        default=0.03,
        help="latency model: seconds per generated token (default: %(default)s)",
    )


def _add_policy_arguments(p: argparse.ArgumentParser) -> None:
    """The policies, the cache sizes and what the learned policies read."""
    pol = p.add_argument_group("policies and cache")
    pol.add_argument("--policies", default=None, help=POLICY_HELP)
    pol.add_argument(
        "--cache-sizes",
        type=_sizes,
        default=None,
        help="cache sizes in tokens: a list (60000,80000, 2M) or a range (60K:160K:20K); "
        f"default {_size_text(DEFAULT_CACHE_SIZES_TOKENS)}, on a --trace "
        f"{_size_text(TRACE_CACHE_SIZES_TOKENS)}",
    )
    pol.add_argument(
        "--block-size",
        type=positive_int,
        default=None,
        help="tokens per KV block (default: 16; an imported trace replays at its own block "
        "size, 512 for Mooncake and 16 for Bailian; it must divide the trace's)",
    )
    pol.add_argument(
        "--scale",
        type=_scale,
        default=None,
        help="LPC decay scale per second, or 'auto' for 1 / the workload's mean observed think "
        "time (default: auto, ahead of the paper's fixed 0.01 on average over the λ_chat sweep "
        "of docs/results.md)",
    )
    pol.add_argument(
        "--fallback-p",
        type=float,
        help="LPC's p when no prediction is available (default: the training half's "
        "continuation rate)",
    )
    pol.add_argument(
        "--model",
        help="predictor artifact folder for the 'lpc' policy (default: the shipped "
        "models/sharegpt-e5-small-q4 when present, on a --trace the access-feature model "
        "models/mooncake-access; a registry's 'current' link works too; 'none' runs without "
        "a model)",
    )

    pol.add_argument(
        "--return-model",
        type=Path,
        default=None,
        help="return-time artifact folder for lpc-return-model (`lpc train-return --out`; "
        "default: the shipped models/mooncake-return, trained on Mooncake's split-0.5 "
        "training part; at another split train one there and pass it)",
    )
    pol.add_argument(
        "--return-tail",
        choices=("flat", "log-linear"),
        default="flat",
        help="what lpc-return-model's curves assume beyond their grid's last point: flat "
        "(nothing more returns; default) or log-linear (the last interval's hazard per "
        "log-second goes on); docs/results.md, 'When a conversation returns'",
    )


def _add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    """The think-time sweep: more generated workloads at one cache size."""
    sweep = p.add_argument_group("think-time sweep")
    sweep.add_argument(
        "--think-time-sweep",
        "--lambda-sweep",
        dest="sweep",
        type=_floats,
        help="also replay each of these mean think times (e.g. 50,100,200) at --sweep-cache-size",
    )
    sweep.add_argument(
        "--sweep-cache-size",
        type=positive_int,
        default=160_000,
        help="cache size in tokens for the sweep (default: %(default)s, the paper's 40 GB)",
    )


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """Result files, the exported trace, parallelism and what is printed."""
    out = p.add_argument_group("output")
    out.add_argument(
        "--out",
        type=Path,
        default=Path("results/ab"),
        help="folder for CSV, markdown, JSON and plots (default: %(default)s)",
    )
    out.add_argument(
        "--export-trace",
        type=Path,
        help="write the replayed requests as a trace in the project's JSONL format (a "
        "generated workload, or an imported trace in the block-hash form)",
    )
    out.add_argument(
        "--trace-probabilities",
        choices=["oracle", "turns", "model"],
        help="with --export-trace: write this source's predictions as each line's 'probability'",
    )
    out.add_argument(
        "--workers",
        type=positive_int,
        default=2,
        help="parallel replay processes (default: %(default)s)",
    )
    out.add_argument("--no-progress", action="store_true", help="no progress bars")
    out.add_argument(
        "--json", action="store_true", help="print all figures as JSON instead of tables"
    )


def model_path_from(args: argparse.Namespace) -> Path | None:
    """--model, else the shipped model when present (on a --trace the access-feature model
    models/mooncake-access, else the text model); None for 'none' or no model at all."""
    from lpc.errors import CommandError
    from training.locations import SHIPPED_ACCESS_MODEL_NAME, shipped_model_dir

    if args.model is None:
        if args.trace is not None:
            return shipped_model_dir(SHIPPED_ACCESS_MODEL_NAME)
        return shipped_model_dir()
    if args.model == "none":
        return None
    path = Path(args.model)
    if not path.is_dir():
        raise CommandError(f"--model {path} is not an artifact folder")
    return path


def _with_learned_lpc(policies: tuple[str, ...]) -> tuple[str, ...]:
    """`lpc` and `lpc-pooled` inserted before the upper bounds."""
    bounds = [i for i, p in enumerate(policies) if p in ("oracle", "belady")]
    at = bounds[0] if bounds else len(policies)
    return (*policies[:at], "lpc", "lpc-pooled", *policies[at:])


def _policies_from(args: argparse.Namespace, model_available: bool) -> tuple[PolicySpec, ...]:
    """--policies, else the defaults for a data set or a trace (learned LPC joins them when a
    model is available). An empty --policies is a mistake to report, not the defaults."""
    from lpc.errors import CommandError, InvalidInputError
    from lpc.replay.policies import default_policies, default_trace_policies, parse_policies

    if args.trace:
        defaults = default_trace_policies()
        if model_available:  # learned LPC (the access model) joins the trace policies
            defaults = _with_learned_lpc(defaults)
    else:
        defaults = default_policies(model_available)
    text = ",".join(defaults) if args.policies is None else args.policies
    try:
        return tuple(parse_policies(text))
    except InvalidInputError as error:
        raise CommandError(f"--policies: {error}") from None


def _duration_from(args: argparse.Namespace) -> float | None:
    """--duration in seconds; None for 'all'."""
    from lpc.errors import CommandError

    if args.duration == "all":
        return None
    try:
        return positive_float(args.duration)
    except argparse.ArgumentTypeError as error:
        raise CommandError(f"--duration: {error} (or 'all')") from None


def _check_flags(args: argparse.Namespace, policies: tuple[PolicySpec, ...]) -> None:
    """Values and combinations of flags that cannot run, refused before anything loads."""
    from lpc.errors import CommandError
    from lpc.traces.jsonl import TraceError
    from lpc.traces.load import resolve_trace

    if args.fallback_p is not None and not 0.0 <= args.fallback_p <= 1.0:
        raise CommandError(f"--fallback-p must be in [0, 1], got {args.fallback_p}")
    per_token = args.time_per_output_token
    if not math.isfinite(per_token) or per_token < 0:
        raise CommandError(f"--time-per-output-token must be a finite number >= 0, got {per_token}")
    if args.trace_probabilities and not args.export_trace:
        raise CommandError("--trace-probabilities goes with --export-trace")
    if args.trace is not None:
        try:
            resolve_trace(args.trace)  # before any data set is loaded
        except TraceError as error:
            raise CommandError(str(error)) from None
    elif args.split_at is not None or args.trace_format is not None:
        raise CommandError("--split-at and --trace-format go with --trace")
    if args.closed_loop and any(p.label == "belady" for p in policies):
        raise CommandError("belady needs a fixed trace: drop it from --policies with --closed-loop")
    if args.closed_loop and args.trace:
        raise CommandError("--closed-loop generates its own timeline; it cannot replay --trace")
    if args.offload_sizes and args.closed_loop:
        raise CommandError("--offload-sizes replays a fixed timeline; it cannot run --closed-loop")
    if args.sweep and args.trace:
        raise CommandError("--think-time-sweep generates workloads; it cannot replay --trace")
    if not args.trace and any(p.source == "trace" for p in policies):
        raise CommandError("policy lpc-trace replays a trace's logged probabilities: add --trace")


def options_from(args: argparse.Namespace, model_available: bool = False) -> ABOptions:
    """The parsed flags as `ABOptions`, every value and combination checked."""
    from lpc.replay.ab_options import ABOptions
    from lpc.workload import LatencyModel, WorkloadConfig

    policies = _policies_from(args, model_available)
    duration = _duration_from(args)
    _check_flags(args, policies)
    latency = LatencyModel(
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        time_per_output_token_s=args.time_per_output_token,
        closed_loop=args.closed_loop,
    )
    workload = WorkloadConfig(args.think_time, args.max_active, duration, args.seed, latency)
    return ABOptions(
        dataset=args.dataset,
        data_format=args.data_format,
        mode=args.mode,
        trace=args.trace,
        trace_format=args.trace_format,
        split_at=args.split_at,
        horizon_s=args.horizon,
        shared_fanout=args.shared_fanout,
        policies=policies,
        policies_by_default=args.policies is None,
        cache_sizes_tokens=args.cache_sizes,
        block_size=args.block_size,
        workload=workload,
        max_model_len=args.max_model_len,
        scale_per_s=args.scale,
        fallback_probability=args.fallback_p,
        think_time_sweep_s=args.sweep or (),
        sweep_cache_tokens=args.sweep_cache_size,
        export_trace=args.export_trace,
        trace_probabilities=args.trace_probabilities,
        out_dir=args.out,
        workers=args.workers,
        progress=not args.no_progress,
        tiers=tier_settings_from(args),
        return_model=args.return_model,
        return_tail=args.return_tail,
    )


def check_out_dir(out: Path, export_trace: Path | None = None) -> None:
    """--out (and --export-trace's folder) must be writable: checked before minutes of
    replay, not after (a path below a file, a read-only folder, a full disk)."""
    from predictor.atomic_files import check_output_folder

    check_output_folder(out, "--out")
    if export_trace is not None:
        check_output_folder(export_trace.parent, "--export-trace")


def _is_access_model(model: Path) -> bool:
    from lpc.errors import CommandError
    from predictor.artifact import ArtifactError, read_metadata

    try:
        return not read_metadata(model).inputs.text_window
    except ArtifactError as error:
        raise CommandError(str(error)) from None


def _model_source(
    options: ABOptions, model: Path | None, log: Callable[[str], None]
) -> tuple[ABOptions, ModelSourceFactory | None]:
    """The factory of the learned predictor's source when a policy (or the exported trace)
    reads it: the access-feature model's, or the text model's (which embeds the prompts)."""
    from dataclasses import replace

    from lpc.errors import CommandError

    wants_model = options.trace_probabilities == "model" or any(
        p.source == "model" for p in options.policies
    )
    if not wants_model:
        return options, None
    if model is None:
        learned = [p.label for p in options.policies if p.source == "model"] or ["lpc"]
        raise CommandError(f"policy {learned[0]!r} needs a trained predictor model (--model PATH)")
    if _is_access_model(model):
        from lpc.access.source import access_source_factory

        return replace(options, model_reads_text=False), access_source_factory(model, log=log)
    extras.require("text")  # a text model embeds the prompts
    from lpc.replay.learned_source import learned_source_factory
    from training.embedding_cache import EmbedOptions
    from training.locations import default_embedding_cache_dir

    factory = learned_source_factory(
        model, default_embedding_cache_dir(), EmbedOptions(progress=options.progress), log=log
    )
    return options, factory


def run(args: argparse.Namespace) -> int:
    import sys

    # The replay, the trace formats and the chat tokeniser (built for traces too).
    extras.require("replay", "data")
    from lpc.replay.ab_run import run_ab
    from predictor.atomic_files import ResultsNotSavedError
    from training.loaders import check_source

    model = model_path_from(args)
    options = options_from(args, model_available=model is not None)
    check_source(options.dataset)  # a missing path fails in a second, not after the setup
    if options.return_model is not None and any(
        p.curve_source == "model" for p in options.replayed_policies
    ):
        from lpc.replay.return_sources import load_return_model

        load_return_model(options.return_model)  # so is an artifact of the wrong kind
    log = (lambda message: print(message, file=sys.stderr)) if args.json else print
    options, factory = _model_source(options, model, log)
    check_out_dir(options.out_dir, options.export_trace)
    # Bad data, traces, models and embedders raise `UserError`s, which the CLI shows as one
    # line; anything else escaping run_ab is a bug and keeps its traceback.
    try:
        outcome = run_ab(options, model_factory=factory, log=log)
    except ResultsNotSavedError as error:
        # The figures are printed (JSON on stdout with --json), then the one-line error
        # naming the files: exit 2, never 0, and nothing computed is lost.
        _print_outcome(error.results, args.json)
        raise
    _print_outcome(outcome, args.json)
    return 0


def _print_outcome(outcome: ABOutcome, as_json: bool) -> None:
    """The figures: on the terminal, or as JSON on stdout."""
    from lpc.replay.ab_report import outcome_json, summary_text

    if as_json:
        print(outcome_json(outcome))
        return
    print()
    print(summary_text(outcome))
    print()
    t = outcome.timings_s
    print(
        f"replays: {t.get('replay_s', 0):.1f} s; total {t['total_s']:.1f} s "
        f"(load {t['load_s']:.1f} s, workload {t['workload_s']:.1f} s)"
    )
    print(f"files: {', '.join(outcome.files.values()) or 'none'}")
