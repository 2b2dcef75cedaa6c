"""Closed-loop load against a running prediction server, with every answer checked.

Each of `clients` threads sends a request, waits for the answer, and sends the next, until
`duration_s` has passed (or `max_requests` were sent); request sizes may be mixed. Every
request ends in exactly one outcome (right, mismatched, 503, another status, a transport
failure); the acceptance is zero lost, zero mismatched, and a healthy server afterwards.

The outcomes and the request sizes: docs/design.md, "The load test".
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import numpy as np

from predictor.client import check_predictor_url
from predictor.features import ConversationWindow
from predictor.latency_stats import LatencySummary
from predictor.rpc_schema import window_to_json


@dataclass(frozen=True)
class LoadTestConfig:
    url: str
    clients: int = 64
    duration_s: float = 30.0
    max_requests: int | None = None
    items_per_request: int = 1
    max_items_per_request: int | None = None  # draw each request's size in [items, max]
    timeout_s: float = 60.0  # generous: a slow answer is not a lost one
    overload_backoff_s: float = 0.1
    tolerance: float = 0.0  # max |server − expected| accepted as equal
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.clients < 1 or self.items_per_request < 1:
            raise ValueError("clients and items_per_request must be >= 1")
        if self.max_items_per_request is not None and (
            self.max_items_per_request < self.items_per_request
        ):
            raise ValueError("max_items_per_request must be >= items_per_request")
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ValueError(f"duration_s must be a finite number > 0, got {self.duration_s!r}")
        try:
            check_predictor_url(self.url)
        except ValueError as error:
            raise ValueError(f"url {error}") from None
        # Both end up in a timer (httpx's timeout, a sleep): at most a day, as every timer.
        if not (isinstance(self.timeout_s, int | float) and 0 < self.timeout_s <= 86_400):
            raise ValueError(f"timeout_s must be in (0, 86400] seconds, got {self.timeout_s!r}")
        backoff = self.overload_backoff_s
        if not (isinstance(backoff, int | float) and 0 <= backoff <= 86_400):
            raise ValueError(f"overload_backoff_s must be in [0, 86400] seconds, got {backoff!r}")


@dataclass
class LoadTestReport:
    clients: int
    duration_s: float
    requests_sent: int
    answered_ok: int
    overloaded_503: int
    other_status: dict[str, int]
    transport_errors: int
    lost: int
    mismatched: int
    max_abs_error: float
    windows_answered: int
    predictions_per_s: float
    ok_latency: LatencySummary
    overloaded_latency: LatencySummary
    healthy_after: bool
    health_after: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def passed(self) -> bool:
        return (
            self.lost == 0
            and self.mismatched == 0
            and self.transport_errors == 0
            and not self.other_status
            and self.healthy_after
        )


class _Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = 0
        self.ok = 0
        self.overloaded = 0
        self.other: Counter[str] = Counter()
        self.transport = 0
        self.mismatched = 0
        self.max_abs_error = 0.0
        self.windows = 0
        self.ok_seconds: list[float] = []
        self.overloaded_seconds: list[float] = []


def run_load_test(
    config: LoadTestConfig,
    windows: Sequence[ConversationWindow],
    expected: Sequence[float] | np.ndarray,
) -> LoadTestReport:
    """Drive the server at `config.url` with `windows`; `expected[i]` is window i's answer."""
    if len(windows) != len(expected) or not windows:
        raise ValueError("windows and expected must be non-empty and of equal length")
    run = _Run(
        config=config,
        expected=np.asarray(expected, dtype=np.float64),
        # Serialised once: encoding a request is then a join, so that clients hammering an
        # overloaded server spend their CPU on sending rather than on building JSON.
        payloads=[json.dumps(window_to_json(w)) for w in windows],
        headers={"Authorization": f"Bearer {config.token}"} if config.token else {},
        tally=_Tally(),
        budget=config.max_requests,
        ready=threading.Barrier(config.clients + 1),
    )
    elapsed = _drive(run)
    return _report(config, run.tally, elapsed, _health_after(config, run.headers))


@dataclass
class _Run:
    """What the client threads share. Clients are created first (an httpx client takes a
    while to build); the clock starts when all are `ready`, and `deadline` is set before
    `go`, so every client reads it after the start."""

    config: LoadTestConfig
    payloads: list[str]  # window i as JSON
    expected: np.ndarray
    headers: dict[str, str]
    tally: _Tally
    budget: int | None  # requests still to send (None: no bound); changed under tally.lock
    ready: threading.Barrier
    go: threading.Event = field(default_factory=threading.Event)
    deadline: float = 0.0


def _drive(run: _Run) -> float:
    """Start the clients, release them together once all are ready, wait for them all;
    the seconds from the release to the last client's end."""
    threads = [
        threading.Thread(target=_client, args=(run, i), name=f"load-{i}")
        for i in range(run.config.clients)
    ]
    for thread in threads:
        thread.start()
    run.ready.wait(timeout=300)
    started = time.monotonic()
    run.deadline = started + run.config.duration_s
    run.go.set()
    for thread in threads:
        thread.join()
    return time.monotonic() - started


def _take_ticket(run: _Run) -> bool:
    """Count a request as sent, unless `max_requests` are already out."""
    with run.tally.lock:
        if run.budget is not None:
            if run.budget <= 0:
                return False
            run.budget -= 1
        run.tally.sent += 1
        return True


def _client(run: _Run, index: int) -> None:
    """One closed-loop client: send, wait for the answer, record it, send the next. Each
    starts at its own place in the windows and draws its request sizes from its own seeded
    generator, so runs repeat."""
    config, window_count = run.config, len(run.payloads)
    cursor = index * 7919 % window_count
    sizes = np.random.default_rng([index, 17])
    largest = config.max_items_per_request or config.items_per_request
    with httpx.Client(base_url=config.url, headers=run.headers, timeout=config.timeout_s) as http:
        run.ready.wait(timeout=300)
        run.go.wait(timeout=300)
        deadline = run.deadline
        while time.monotonic() < deadline and _take_ticket(run):
            count = int(sizes.integers(config.items_per_request, largest + 1))
            chosen = [(cursor + k) % window_count for k in range(count)]
            cursor = (cursor + count) % window_count
            sent_at = time.perf_counter()
            try:
                body = '{"items": [' + ", ".join(run.payloads[i] for i in chosen) + "]}"
                response = http.post(
                    "/v1/predict",
                    content=body.encode(),
                    headers={"Content-Type": "application/json"},
                )
            except httpx.HTTPError:
                with run.tally.lock:
                    run.tally.transport += 1
                continue
            _record(run, response, chosen, time.perf_counter() - sent_at)


def _record(run: _Run, response: httpx.Response, chosen: list[int], elapsed: float) -> None:
    """Tally one answer: a 503 (then back off briefly, as a caller that falls back would),
    another status, or a 200 whose probabilities are compared with the expected ones."""
    tally = run.tally
    if response.status_code == 503:
        with tally.lock:
            tally.overloaded += 1
            tally.overloaded_seconds.append(elapsed)
        time.sleep(run.config.overload_backoff_s)
        return
    if response.status_code != 200:
        with tally.lock:
            tally.other[str(response.status_code)] += 1
        return
    answer = np.asarray(response.json().get("probabilities", []), dtype=np.float64)
    want = run.expected[chosen]
    error = float(np.max(np.abs(answer - want))) if answer.shape == want.shape else math.inf
    with tally.lock:
        tally.ok += 1
        tally.windows += len(chosen)
        tally.ok_seconds.append(elapsed)
        tally.max_abs_error = max(tally.max_abs_error, error)
        if error > run.config.tolerance:
            tally.mismatched += 1


def _health_after(config: LoadTestConfig, headers: dict[str, str]) -> dict[str, Any] | None:
    """The server's /healthz answer after the load, or None when it gives none: a server
    that survived the load but no longer answers has not passed."""
    try:
        reply = httpx.get(config.url + "/healthz", headers=headers, timeout=10)
        return reply.json() if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _report(
    config: LoadTestConfig, tally: _Tally, elapsed: float, health: dict[str, Any] | None
) -> LoadTestReport:
    """The tally as a report; a request with no answer of any kind counts as lost."""
    answered = tally.ok + tally.overloaded + sum(tally.other.values())
    return LoadTestReport(
        clients=config.clients,
        duration_s=round(elapsed, 3),
        requests_sent=tally.sent,
        answered_ok=tally.ok,
        overloaded_503=tally.overloaded,
        other_status=dict(tally.other),
        transport_errors=tally.transport,
        lost=tally.sent - answered,
        mismatched=tally.mismatched,
        max_abs_error=tally.max_abs_error,
        windows_answered=tally.windows,
        predictions_per_s=round(tally.windows / elapsed, 3),
        ok_latency=LatencySummary.of_seconds(tally.ok_seconds),
        overloaded_latency=LatencySummary.of_seconds(tally.overloaded_seconds),
        healthy_after=health is not None and health.get("status") == "ok",
        health_after=health,
    )
