"""`lpc bench release`: the vLLM plugin's release-path latency with the access model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lpc.cli.arg_types import positive_int


def register(targets: argparse._SubParsersAction) -> None:
    parser = targets.add_parser(
        "release",
        help="the plugin's release path: µs per finished request at 1K, 11K and 128K tokens",
        description=(
            "Times what the vLLM plugin does when a finished request frees its blocks: its "
            "release (the access model's p from the request, its conversation table entry and "
            "the shared prefix from vLLM's block hashes) and the LPC queue's append_n of the "
            "request's blocks, with vLLM-like requests and blocks, the shipped access model "
            "and a warm conversation table; p50/p99/mean per request size, against the target "
            "(p50 <= 20 µs, p99 <= 100 µs). With --evictor lpc-return the release computes the "
            "return-time model's curve (--return-model, the shipped one by default) from the "
            "same features, with no access model unless --model is given. "
            "Timer: time.perf_counter_ns."
        ),
    )
    parser.add_argument(
        "--model",
        type=Path,
        help="access-only artifact folder (default: the shipped one; with --evictor lpc-return "
        "none unless given)",
    )
    parser.add_argument(
        "--return-model",
        type=Path,
        help="return-time artifact folder for --evictor lpc-return (default: the shipped "
        "models/mooncake-return)",
    )
    parser.add_argument(
        "--sizes",
        default="1024,11264,131072",
        help="request sizes in tokens, comma-separated (default 1024,11264,131072)",
    )
    parser.add_argument(
        "--releases", type=positive_int, default=5000, help="timed releases per size (5000)"
    )
    parser.add_argument(
        "--conversations", type=positive_int, default=16, help="conversations interleaved (16)"
    )
    parser.add_argument(
        "--block-size", type=positive_int, default=16, help="tokens per block (vLLM's 16)"
    )
    parser.add_argument(
        "--evictor",
        choices=("lpc-pooled", "lpc", "lpc-return"),
        default="lpc-pooled",
        help="the plugin's evictor (default lpc-pooled, the plugin's default)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(run=run)


def _sizes(text: str, block_size: int) -> tuple[int, ...]:
    from lpc.benchmarks.release_bench import MESSAGE_TOKENS, OUTPUT_TOKENS
    from lpc.errors import CommandError

    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise CommandError(f"--sizes must be comma-separated token counts, got {text!r}") from None
    smallest = MESSAGE_TOKENS + OUTPUT_TOKENS + block_size
    for size in sizes:
        if size < smallest:
            raise CommandError(
                f"--sizes: {size} tokens is below the smallest request the workload builds "
                f"({smallest} at --block-size {block_size})"
            )
    return sizes


def _models(args: argparse.Namespace) -> tuple[Path | None, Path | None]:
    """The access model and the return-time model the chosen evictor needs (shipped ones by
    default), or a `CommandError` when one is missing or given to the wrong evictor."""
    from lpc.errors import CommandError
    from training.locations import (
        SHIPPED_ACCESS_MODEL_NAME,
        SHIPPED_RETURN_MODEL_NAME,
        shipped_model_dir,
    )

    model = args.model
    if args.evictor == "lpc-return":
        return_model = args.return_model or shipped_model_dir(SHIPPED_RETURN_MODEL_NAME)
        if return_model is None:
            raise CommandError("no return-time model: pass --return-model FOLDER")
        return model, return_model
    if args.return_model is not None:
        raise CommandError("--return-model is for --evictor lpc-return")
    model = model or shipped_model_dir(SHIPPED_ACCESS_MODEL_NAME)
    if model is None:
        raise CommandError("no access-only model: pass --model FOLDER")
    return model, None


def run(args: argparse.Namespace) -> int:
    from lpc.benchmarks import release_bench
    from lpc.errors import CommandError

    sizes = _sizes(args.sizes, args.block_size)
    model, return_model = _models(args)
    from lpc.integrations.config import PluginConfigError

    try:
        result = release_bench.run(
            model,
            sizes,
            args.releases,
            args.conversations,
            args.block_size,
            args.evictor,
            progress=None if args.json else lambda line: print(line, file=sys.stderr),
            return_model=return_model,
        )
    except PluginConfigError as error:
        raise CommandError(str(error)) from None
    if args.json:
        print(result.to_json())
    else:
        print("\n".join(release_bench.summary_lines(result)))
    return 0
