"""Errors the `lpc` CLI shows as one line with exit status 2 (everything else is a bug).

`UserError` is the base of every input error in the project (loaders, traces, artifacts,
embedders, policies); `lpc.cli.main.main` prints it as `lpc <verb>: error: <message>` and lets any
other exception show its traceback, so a bug never passes for bad input.
"""

from __future__ import annotations

from predictor.errors import InvalidInputError, UserError

__all__ = ["CommandError", "InvalidInputError", "UserError"]


class CommandError(UserError):
    """A flag or a combination of flags the command cannot run with."""
