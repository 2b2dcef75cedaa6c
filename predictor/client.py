"""Client of the prediction RPC for the inference side: never raises, never waits long.

`predict` returns None on any failure within its deadline (the evictor then uses its fallback
probability) and counts what went wrong in `stats`. Items that are not JSON are refused here,
before anything is sent (`invalid_input`). It imports only httpx and numpy (through
`predictor.features`), so it also runs inside an inference engine's environment (the vLLM
plugin imports it there).

The items it sends: docs/design.md, "The prediction client"; docs/predictor.md, "Client".
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from predictor.features import ConversationWindow

Item = ConversationWindow | Mapping[str, Any]


@dataclass
class ClientStats:
    calls: int = 0  # predict() calls
    successes: int = 0
    failures: int = 0  # calls that returned None; the kinds below add up to it
    timeouts: int = 0
    connection_errors: int = 0
    overloaded: int = 0  # HTTP 503
    http_errors: int = 0  # any other non-200 status
    malformed: int = 0  # 200 with an answer we cannot use
    invalid_input: int = 0  # items we could not serialise
    last_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_predictor_url(url: object) -> str:
    """`url` if it is an http(s) URL httpx can send to, else ValueError saying what is wrong.

    Checked where the URL is configured: httpx would only find out at the first request (or
    at `Client(base_url=...)`), as an `InvalidURL` that names no setting.
    """
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL, got {url!r}")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # ValueError for a port that is not a number in [0, 65535]
    except ValueError as error:
        raise ValueError(f"is not a valid URL ({error}), got {url!r}") from None
    if not parts.hostname:
        raise ValueError(f"has no host, got {url!r}")
    if port == 0:
        raise ValueError(f"port must be in [1, 65535], got {url!r}")
    try:
        httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as error:
        raise ValueError(f"is not a valid URL ({error}), got {url!r}") from None
    return url


class PredictorClient:
    """`predict(items)` → probabilities in order, or None. Thread-safe.

    Items over `max_items_per_request` go out as several requests, in sequence, all within
    the one `timeout_s` deadline.
    """

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 1.0,
        token: str | None = None,
        max_items_per_request: int = 64,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_items_per_request < 1:
            raise ValueError(f"max_items_per_request must be >= 1, got {max_items_per_request}")
        try:
            check_predictor_url(base_url)
        except ValueError as error:
            raise ValueError(f"base_url {error}") from None
        self.base_url = base_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.max_items_per_request = max_items_per_request
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, transport=transport, timeout=self.timeout_s
        )
        self._lock = threading.Lock()
        self.stats = ClientStats()

    def __enter__(self) -> PredictorClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _fail(self, kind: str, message: str) -> None:
        with self._lock:
            self.stats.failures += 1
            setattr(self.stats, kind, getattr(self.stats, kind) + 1)
            self.stats.last_error = message

    def predict(self, items: Sequence[Item]) -> list[float] | None:
        """One probability per item, in order, or None (the items: docs/design.md, "The
        prediction client")."""
        with self._lock:
            self.stats.calls += 1
        size = self.max_items_per_request
        try:
            payload = [i.to_dict() if isinstance(i, ConversationWindow) else dict(i) for i in items]
            chunks = [payload[start : start + size] for start in range(0, len(payload), size)]
            bodies = [_body(chunk) for chunk in chunks]  # all encoded before any is sent
        except (TypeError, ValueError) as error:
            self._fail("invalid_input", f"cannot serialise items: {error}")
            return None
        if not payload:
            with self._lock:
                self.stats.successes += 1
            return []
        deadline = time.monotonic() + self.timeout_s
        answer: list[float] = []
        for chunk, body in zip(chunks, bodies, strict=True):
            probabilities = self._post(body, len(chunk), deadline)
            if probabilities is None:
                return None
            answer.extend(probabilities)
        with self._lock:
            self.stats.successes += 1
        return answer

    def _post(self, body: bytes, items: int, deadline: float) -> list[float] | None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._fail("timeouts", "deadline passed before the request was sent")
            return None
        try:
            response = self._http.post(
                "/v1/predict",
                content=body,
                headers={"Content-Type": "application/json"},
                timeout=httpx.Timeout(remaining),
            )
        except httpx.TimeoutException as error:
            self._fail("timeouts", f"timeout: {error!r}")
            return None
        except (httpx.TransportError, OSError) as error:
            self._fail("connection_errors", f"transport: {error!r}")
            return None
        except Exception as error:  # anything else still must not reach the caller
            self._fail("connection_errors", f"unexpected: {error!r}")
            return None
        if response.status_code == 503:
            self._fail("overloaded", f"503: {response.text[:200]}")
            return None
        if response.status_code != 200:
            self._fail("http_errors", f"{response.status_code}: {response.text[:200]}")
            return None
        try:
            probabilities = response.json()["probabilities"]
        except (ValueError, KeyError, TypeError) as error:
            self._fail("malformed", f"unreadable answer: {error!r}")
            return None
        if (
            not isinstance(probabilities, list)
            or len(probabilities) != items
            or not all(_is_probability(p) for p in probabilities)
        ):
            self._fail(
                "malformed",
                f"expected {items} probabilities in [0, 1], got {str(probabilities)[:200]}",
            )
            return None
        return [float(p) for p in probabilities]

    def health(self) -> dict[str, Any] | None:
        """The server's /healthz answer, or None when it does not answer in time."""
        try:
            response = self._http.get("/healthz")
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, OSError, ValueError):
            return None


def _body(items: list[dict[str, Any]]) -> bytes:
    """A predict request's JSON, as httpx would encode it; ValueError for NaN or infinities."""
    text = json.dumps({"items": items}, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")


def _is_probability(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0.0 <= value <= 1.0
    )
