"""The `lpc` command line: one verb per module in `lpc.commands`.

Each command module exposes `register(subparsers)`, which adds its parser and sets `run`; heavy
imports happen inside `run`, so `lpc --help` stays instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lpc import __version__
from lpc.commands import COMMAND_MODULES


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit status 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lpc",
        description="Learned prefix-cache eviction: A/B replay, predictor service, training.",
    )
    parser.add_argument("--version", action="version", version=f"lpc {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except CommandError as error:
        print(f"lpc {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lpc {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    # `python -m lpc.cli` runs this file as `__main__`; commands raise `lpc.cli.CommandError`,
    # a different class from this copy's, so run the imported module's `main`.
    from lpc.cli import main as imported_main

    sys.exit(imported_main())
