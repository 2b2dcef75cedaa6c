"""Closed-loop load against a running prediction server, with every answer checked.

Each of `clients` threads sends a request, waits for the answer, and sends the next, until
`duration_s` has passed (or `max_requests` were sent). A request carries `items_per_request`
windows, or, with `max_items_per_request`, a number drawn uniformly from that range (seeded
per client, so runs repeat): mixed request sizes, the load admission by work is for.

Every request ends in exactly one outcome: 200 with the expected probabilities, 200 with
wrong ones (mismatched), 503 (overloaded, the documented answer past the queue bound; the
client backs off briefly, as a caller that falls back and asks again on its next request
would), another status (a 504 among them), or a transport failure. "Lost" requests are those
with no answer at all; the acceptance is zero lost, zero mismatched, and a healthy server
afterwards.
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
    expected = np.asarray(expected, dtype=np.float64)
    # Serialised once: encoding a request is then a join, so that clients hammering an
    # overloaded server spend their CPU on sending rather than on building JSON.
    payloads = [json.dumps(window_to_json(w)) for w in windows]
    tally = _Tally()
    headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
    budget = [config.max_requests]
    # Clients are created first (an httpx client takes a while to build); the clock starts
    # when all are ready.
    ready = threading.Barrier(config.clients + 1)
    go = threading.Event()
    clock = {"deadline": 0.0}

    def take_ticket() -> bool:
        with tally.lock:
            if budget[0] is not None:
                if budget[0] <= 0:
                    return False
                budget[0] -= 1
            tally.sent += 1
            return True

    def client(index: int) -> None:
        cursor = index * 7919 % len(windows)
        sizes = np.random.default_rng([index, 17])
        largest = config.max_items_per_request or config.items_per_request
        with httpx.Client(base_url=config.url, headers=headers, timeout=config.timeout_s) as http:
            ready.wait(timeout=300)
            go.wait(timeout=300)
            deadline = clock["deadline"]
            while time.monotonic() < deadline and take_ticket():
                count = int(sizes.integers(config.items_per_request, largest + 1))
                chosen = [(cursor + k) % len(windows) for k in range(count)]
                cursor = (cursor + count) % len(windows)
                sent_at = time.perf_counter()
                try:
                    body = '{"items": [' + ", ".join(payloads[i] for i in chosen) + "]}"
                    response = http.post(
                        "/v1/predict",
                        content=body.encode(),
                        headers={"Content-Type": "application/json"},
                    )
                except httpx.HTTPError:
                    with tally.lock:
                        tally.transport += 1
                    continue
                elapsed = time.perf_counter() - sent_at
                if response.status_code == 503:
                    with tally.lock:
                        tally.overloaded += 1
                        tally.overloaded_seconds.append(elapsed)
                    time.sleep(config.overload_backoff_s)
                    continue
                if response.status_code != 200:
                    with tally.lock:
                        tally.other[str(response.status_code)] += 1
                    continue
                answer = np.asarray(response.json().get("probabilities", []), dtype=np.float64)
                want = expected[chosen]
                error = (
                    float(np.max(np.abs(answer - want))) if answer.shape == want.shape else math.inf
                )
                with tally.lock:
                    tally.ok += 1
                    tally.windows += len(chosen)
                    tally.ok_seconds.append(elapsed)
                    tally.max_abs_error = max(tally.max_abs_error, error)
                    if error > config.tolerance:
                        tally.mismatched += 1

    threads = [
        threading.Thread(target=client, args=(i,), name=f"load-{i}") for i in range(config.clients)
    ]
    for thread in threads:
        thread.start()
    ready.wait(timeout=300)
    started = time.monotonic()
    clock["deadline"] = started + config.duration_s
    go.set()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    health = None
    try:
        reply = httpx.get(config.url + "/healthz", headers=headers, timeout=10)
        health = reply.json() if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        health = None
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
