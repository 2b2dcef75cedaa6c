"""The base class of errors caused by what a user gave (a file, a flag, a dataset, a model).

Front ends show such an error as one line naming what is wrong and where; any other exception
is a bug and keeps its traceback. It lives here, in the package everything else may import,
so that the loaders (`training`), the artifact and embedder errors (`predictor`) and the CLI's
own errors (`lpc`) can all subclass it without an import pointing the wrong way.
"""

from __future__ import annotations


class UserError(Exception):
    """A failure the user can fix by changing their input; its message says what and where."""


class InvalidInputError(UserError, ValueError):
    """A value the user gave is invalid; still a `ValueError` for callers that catch those."""
