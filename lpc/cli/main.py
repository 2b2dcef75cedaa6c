"""The `lpc` command line: one verb per module in `lpc.cli`, in the order `lpc --help` lists them.

Each command module exposes `register(subparsers)`, which adds its parser and sets `run`; heavy
imports happen inside `run`, so `lpc --help` stays instant, and works on the core install: a
command whose extra is missing says which `pip install` it needs (`lpc.cli.extras`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lpc import __version__
from lpc.cli import (
    ab,
    bench,
    fleet,
    models,
    prequential,
    retrain,
    serve,
    train,
    train_return,
    vllm_ab,
)
from lpc.cli.extras import missing_extra
from lpc.errors import CommandError, UserError

__all__ = ["CommandError", "build_parser", "main"]

COMMAND_MODULES = (
    ab,
    vllm_ab,
    fleet,
    train,
    train_return,
    prequential,
    retrain,
    serve,
    models,
    bench,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lpc",
        allow_abbrev=False,
        description="Learned prefix-cache eviction: A/B replay, predictor service, training.",
    )
    parser.add_argument("--version", action="version", version=f"lpc {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for module in COMMAND_MODULES:
        module.register(subparsers)
    for sub in all_parsers(parser):
        # `--model` must not silently become `--model-root`: only whole flag names count.
        sub.allow_abbrev = False
    return parser


def print_undecodable_paths() -> None:
    """A path that is not valid UTF-8 (a byte such as \xff in a file name) reaches Python as
    a lone surrogate, which a strict standard output refuses, failing a finished run at its
    summary: print it escaped (`\udcff`) instead. The C locale already writes the raw byte."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None and sys.stdout.errors == "strict":
        reconfigure(errors="backslashreplace")


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every sub-parser below it, depth first."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                found.extend(all_parsers(sub))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    print_undecodable_paths()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    # Bad input is one line and exit 2; any other exception is a bug and keeps its traceback.
    except UserError as error:
        print(f"lpc {args.command}: error: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        # An optional dependency of an extra this installation lacks; any other is a bug.
        extra_error = missing_extra(error)
        if extra_error is None:
            raise
        print(f"lpc {args.command}: error: {extra_error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lpc {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
