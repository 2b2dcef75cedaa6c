"""The prediction RPC's bearer token: where `lpc serve` (which checks it) and `lpc retrain`
(which sends it with a reload notification) both find it, so they cannot disagree."""

from __future__ import annotations

import os
from pathlib import Path

from predictor.errors import InvalidInputError

TOKEN_ENV = "LPC_PREDICTOR_TOKEN"


def read_bearer_token(token_file: Path | None, flag: str) -> str | None:
    """The token in `token_file` (given by `flag`), else $LPC_PREDICTOR_TOKEN, else None.
    ValueError naming the flag and the file when the file cannot be read."""
    if token_file is None:
        return os.environ.get(TOKEN_ENV, "").strip() or None
    try:
        return token_file.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise InvalidInputError(f"{flag} {token_file}: {error}") from None
