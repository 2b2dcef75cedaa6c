"""`lpc ab`: replay chats (or a request trace) through the block manager, policy by policy."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from lpc.ab import DEFAULT_CACHE_SIZES_TOKENS
from lpc.policies import policy_help

DESCRIPTION = """\
Replay a chat workload through the prefix-caching block manager once per eviction policy and
cache size, on one identical trace, and report token hit ratios the way the LPC paper does:
relative gain over LRU, the share of the LRU→oracle gap closed, and the cache size each policy
needs to match LRU's hit ratio. By default the workload is the paper's: the evaluation half of
the bundled ShareGPT (never trained on), exponential think times (mean 100 s), at most 200
active conversations, a 20-minute window. Writes a table to the terminal and CSV, markdown,
JSON and PNG plots to --out.
"""

POLICY_HELP = policy_help()  # built from the policy registry


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _sizes(text: str) -> tuple[int, ...]:
    """`60000,80000` or `60K:160K:20K` (start:stop:step, inclusive)."""

    def tokens(part: str) -> int:
        part = part.strip().upper()
        scale = 1000 if part.endswith("K") else 1
        try:
            value = int(float(part.rstrip("K")) * scale)
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


def _scale(text: str) -> float | None:
    """A positive number, or 'auto' (None): 1 / the workload's mean observed think time."""
    return None if text == "auto" else _positive_float(text)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(_positive_float(p) for p in text.split(",") if p.strip())


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ab",
        help="A/B hit-ratio replay of eviction policies",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
        help="replay this JSONL request trace instead of generating a workload "
        "(format: docs/traces.md)",
    )
    data.add_argument(
        "--max-model-len",
        type=_positive_int,
        default=32768,
        help="cut conversations at this many tokens (default: %(default)s)",
    )

    work = p.add_argument_group("workload (the paper's method)")
    work.add_argument(
        "--think-time",
        "--lambda-chat",
        dest="think_time",
        type=_positive_float,
        default=100.0,
        help="mean user think time λ_chat in seconds (default: %(default)s)",
    )
    work.add_argument(
        "--max-active",
        type=_positive_int,
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
        type=_positive_float,
        default=8000.0,
        help="latency model: prefill speed (default: %(default)s)",
    )
    work.add_argument(
        "--time-per-output-token",
        type=float,
        default=0.03,
        help="latency model: seconds per generated token (default: %(default)s)",
    )

    pol = p.add_argument_group("policies and cache")
    pol.add_argument("--policies", default=None, help=POLICY_HELP)
    pol.add_argument(
        "--cache-sizes",
        type=_sizes,
        default=DEFAULT_CACHE_SIZES_TOKENS,
        help="cache sizes in tokens: a list (60000,80000) or a range (60K:160K:20K; default)",
    )
    pol.add_argument(
        "--block-size",
        type=_positive_int,
        default=16,
        help="tokens per KV block (default: %(default)s)",
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
        "models/sharegpt-e5-small-q4 when present; a registry's 'current' link works too; "
        "'none' runs without a model)",
    )

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
        type=_positive_int,
        default=160_000,
        help="cache size in tokens for the sweep (default: %(default)s, the paper's 40 GB)",
    )

    out = p.add_argument_group("output")
    out.add_argument(
        "--out",
        type=Path,
        default=Path("results/ab"),
        help="folder for CSV, markdown, JSON and plots (default: %(default)s)",
    )
    out.add_argument(
        "--export-trace", type=Path, help="write the generated workload as a JSONL trace"
    )
    out.add_argument(
        "--trace-probabilities",
        choices=["oracle", "turns", "model"],
        help="with --export-trace: write this source's predictions as each line's 'probability'",
    )
    out.add_argument(
        "--workers",
        type=_positive_int,
        default=2,
        help="parallel replay processes (default: %(default)s)",
    )
    out.add_argument("--no-progress", action="store_true", help="no progress bars")
    out.add_argument(
        "--json", action="store_true", help="print all figures as JSON instead of tables"
    )
    p.set_defaults(run=run)


def model_path_from(args: argparse.Namespace) -> Path | None:
    """--model, else the shipped model when present; None for 'none' or no model at all."""
    from lpc.cli import CommandError
    from training.locations import shipped_model_dir

    if args.model is None:
        return shipped_model_dir()
    if args.model == "none":
        return None
    path = Path(args.model)
    if not path.is_dir():
        raise CommandError(f"--model {path} is not an artifact folder")
    return path


def options_from(args: argparse.Namespace, model_available: bool = False):
    from lpc.ab_pipeline import ABOptions
    from lpc.cli import CommandError
    from lpc.policies import default_policies, parse_policies
    from lpc.workload import LatencyModel, WorkloadConfig

    try:
        text = args.policies or ",".join(default_policies(model_available))
        policies = tuple(parse_policies(text))
    except ValueError as error:
        raise CommandError(f"--policies: {error}") from None
    if args.duration == "all":
        duration = None
    else:
        try:
            duration = _positive_float(args.duration)
        except argparse.ArgumentTypeError as error:
            raise CommandError(f"--duration: {error} (or 'all')") from None
    if args.fallback_p is not None and not 0.0 <= args.fallback_p <= 1.0:
        raise CommandError(f"--fallback-p must be in [0, 1], got {args.fallback_p}")
    if args.time_per_output_token < 0:
        raise CommandError("--time-per-output-token must be >= 0")
    if args.trace_probabilities and not args.export_trace:
        raise CommandError("--trace-probabilities goes with --export-trace")
    if args.trace and args.export_trace:
        raise CommandError("--export-trace writes a generated workload; --trace replays one")
    if args.closed_loop and any(p.label == "belady" for p in policies):
        raise CommandError("belady needs a fixed trace: drop it from --policies with --closed-loop")
    if args.closed_loop and args.trace:
        raise CommandError("--closed-loop generates its own timeline; it cannot replay --trace")
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
        policies=policies,
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
    )


def run(args: argparse.Namespace) -> int:
    import sys

    from lpc.ab_pipeline import outcome_json, run_ab, summary_text
    from lpc.cli import CommandError
    from lpc.trace import TraceError
    from predictor.artifact import ArtifactError
    from predictor.embedders import EmbedderLoadError

    model = model_path_from(args)
    options = options_from(args, model_available=model is not None)
    log = (lambda message: print(message, file=sys.stderr)) if args.json else print
    wants_model = options.trace_probabilities == "model" or any(
        p.source == "model" for p in options.policies
    )
    if wants_model and model is None:
        raise CommandError("policy 'lpc' needs a trained predictor model (--model PATH)")
    factory = None
    if wants_model and model is not None:
        from lpc.learned_source import learned_source_factory
        from training.embedding_cache import EmbedOptions
        from training.locations import default_embedding_cache_dir

        factory = learned_source_factory(
            model, default_embedding_cache_dir(), EmbedOptions(progress=options.progress), log=log
        )
    try:
        outcome = run_ab(options, model_factory=factory, log=log)
    except TraceError as error:
        raise CommandError(str(error)) from None
    except (ValueError, ArtifactError, EmbedderLoadError) as error:
        raise CommandError(str(error)) from None
    if args.json:
        print(outcome_json(outcome))
        return 0
    print()
    print(summary_text(outcome))
    print()
    t = outcome.timings_s
    print(
        f"replays: {t.get('replay_s', 0):.1f} s; total {t['total_s']:.1f} s "
        f"(load {t['load_s']:.1f} s, workload {t['workload_s']:.1f} s)"
    )
    print(f"files: {', '.join(outcome.files.values())}")
    return 0
