"""The prediction server's settings (`lpc serve`'s flags), checked when they are made."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from predictor.errors import InvalidInputError
from predictor.rpc_schema import RequestLimits

DEFAULT_PORT = 8476
# A timer (a batch wait, a timeout) longer than a day is a typo: refused when the settings are
# made, with the field and its range, not honoured as an hour-long stall.
MAX_TIMER_S = 86_400.0


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_batch: int = 32
    max_wait_ms: float = 0.0
    max_queue_items: int = 256
    request_timeout_s: float = 30.0
    graceful_timeout_s: float = 30.0
    token: str | None = field(default=None, repr=False)
    limits: RequestLimits = field(default_factory=RequestLimits)
    model_root: Path | None = None  # reloads may only load artifacts under this folder
    # Admission: refuse (503) a request whose estimated wait exceeds this. None: half the
    # request timeout, so an estimate off by up to 2x still answers before the timeout.
    max_expected_wait_s: float | None = None

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> InvalidInputError:
            return InvalidInputError(f"ServerConfig.{name} {why}, got {getattr(self, name)!r}")

        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise bad("port", "must be an integer in [0, 65535]")
        for name in ("max_batch", "max_queue_items"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(name, "must be a positive integer")
        for name, most in (
            ("max_wait_ms", MAX_TIMER_S * 1000),
            ("request_timeout_s", MAX_TIMER_S),
            ("graceful_timeout_s", MAX_TIMER_S),
        ):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 <= value <= most  # also refuses NaN
            ):
                raise bad(name, f"must be a number in [0, {most:g}]")
        if self.request_timeout_s == 0:
            raise bad("request_timeout_s", "must be > 0")
        if self.max_wait_ms / 1000 >= self.request_timeout_s:
            # every request would wait out its timeout before its batch starts
            raise bad("max_wait_ms", "must be below request_timeout_s (in ms)")
        wait = self.max_expected_wait_s
        if wait is not None and (
            not isinstance(wait, int | float)
            or isinstance(wait, bool)
            or not math.isfinite(wait)
            or not 0 < wait <= self.request_timeout_s
        ):
            raise bad("max_expected_wait_s", "must be > 0 and <= request_timeout_s")
        if self.token is not None and len(self.token) < 8:
            raise InvalidInputError("ServerConfig.token must be at least 8 characters")

    @property
    def admission_wait_s(self) -> float:
        """The estimated wait past which a request is refused at once (503)."""
        if self.max_expected_wait_s is not None:
            return float(self.max_expected_wait_s)
        return self.request_timeout_s / 2
