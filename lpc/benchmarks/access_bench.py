"""Speed of the access-only predictor in process, and of training one on a trace.

Measured: the artifact's load (read, checksum, parse; no torch, no embedder), the batched
forward pass (requests per second over feature rows), one request from an engine's state
(features computed from `RequestState` + `ConversationState`, then the forward pass: what a
plugin pays per finishing request), features for a whole request table (pandas, the A/B's and
training's path), and optionally the wall time of `lpc train --trace` in a fresh process.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from predictor.access_features import ConversationState, RequestState
from predictor.access_predictor import AccessPredictor


@dataclass
class AccessBenchResult:
    model: str
    features: int
    hidden_sizes: list[int]
    load_ms_median: float
    batch_size: int
    batched_requests_per_s: float
    one_forward_us_median: float
    one_request_us_median: float  # features from engine state + forward pass
    one_request_us_p99: float
    table_features_requests_per_s: float | None
    train_wall_s: float | None
    train_command: str | None
    load_average: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _states(n: int, seed: int) -> list[tuple[RequestState, ConversationState]]:
    """Plausible requests: a few turns in, prompts of 1K–100K tokens, think times of minutes."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        turns = int(rng.integers(0, 8))
        prompt = int(rng.integers(1_000, 100_000))
        arrival = float(rng.uniform(1_000, 3_600))
        conversation = ConversationState(
            turns,
            arrival - float(rng.uniform(0, 900)) if turns else None,
            arrival - float(rng.exponential(200)) if turns else None,
            prompt // 2,
            int(rng.integers(10, 1_000)),
            float(rng.exponential(200)) * turns,
            turns,
            float(rng.exponential(200)) if turns > 1 else 0.0,
            int(rng.integers(10, 1_000)) * turns,
        )
        request = RequestState(
            arrival, prompt, prompt // 2 if turns else 0, int(rng.integers(10, 2_000)), arrival + 5
        )
        out.append((request, conversation))
    return out


def _time_per_call_us(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1_000)
    return times


def run(
    model: Path,
    requests: int = 200_000,
    batch_size: int = 1024,
    single: int = 20_000,
    train_trace: str | None = None,
    seed: int = 0,
) -> AccessBenchResult:
    """Every figure of `AccessBenchResult`, each stage a function below, in this order."""
    predictor, loads = _load_ms(model)
    states = _states(2_000, seed)
    rows = predictor.feature_matrix(states)
    batched = _batched_requests_per_s(predictor, rows, requests, batch_size, seed)
    forward, one = _one_call_us(predictor, rows, states, single)
    table_rate = _table_requests_per_s(predictor)
    train_wall, command = _train_wall_s(train_trace)
    one.sort()
    return AccessBenchResult(
        model=str(model),
        features=len(predictor.feature_names),
        hidden_sizes=list(predictor.metadata.mlp_config.hidden_sizes),
        load_ms_median=statistics.median(loads),
        batch_size=batch_size,
        batched_requests_per_s=batched,
        one_forward_us_median=statistics.median(forward),
        one_request_us_median=statistics.median(one),
        one_request_us_p99=one[int(0.99 * (len(one) - 1))],
        table_features_requests_per_s=table_rate,
        train_wall_s=train_wall,
        train_command=command,
        load_average=os.getloadavg()[0],
    )


def _load_ms(model: Path) -> tuple[AccessPredictor, list[float]]:
    """The artifact loaded 20 times (one load is too short to time alone); the last copy is
    the one measured below."""
    loads = []
    for _ in range(20):
        t0 = time.perf_counter()
        predictor = AccessPredictor.load(model)
        loads.append((time.perf_counter() - t0) * 1_000)
    return predictor, loads


def _batched_requests_per_s(
    predictor: AccessPredictor, rows: np.ndarray, requests: int, batch_size: int, seed: int
) -> float:
    """`requests` feature rows (drawn from `rows`) in batches of `batch_size`, on one BLAS
    thread: the matrices are tiny, and more threads only add hand-off cost (see
    AccessPredictor)."""
    from threadpoolctl import threadpool_limits

    matrix = rows[np.random.default_rng(seed).integers(0, len(rows), requests)]
    with threadpool_limits(limits=1):
        predictor.predict(matrix[:batch_size])  # warm-up
        t0 = time.perf_counter()
        for start in range(0, requests, batch_size):
            predictor.predict(matrix[start : start + batch_size])
        return requests / (time.perf_counter() - t0)


def _one_call_us(
    predictor: AccessPredictor,
    rows: np.ndarray,
    states: list[tuple[RequestState, ConversationState]],
    single: int,
) -> tuple[list[float], list[float]]:
    """Per-call times of one row's forward pass, and of one request from an engine's state
    (features, then the forward pass): what a plugin pays per finishing request."""
    one_row = rows[:1]
    forward = _time_per_call_us(lambda: predictor.predict(one_row), single)
    one = []
    for i in range(single):
        request, conversation = states[i % len(states)]
        t = time.perf_counter_ns()
        predictor.predict_one(request, conversation)
        one.append((time.perf_counter_ns() - t) / 1_000)
    return forward, one


def _table_requests_per_s(predictor: AccessPredictor) -> float | None:
    """Features and predictions for a whole request table (the A/B's and training's path),
    20,000 requests of 3,000 conversations."""
    try:
        import pandas as pd

        table = pd.DataFrame(
            {
                "conversation_id": [f"c{i % 3000}" for i in range(20_000)],
                "arrival_s": np.arange(20_000, dtype=np.float64),
                "completion_s": np.arange(20_000, dtype=np.float64) + 5,
                "prompt_tokens": 5_000 + np.arange(20_000) % 7_000,
                "output_tokens": 300,
                "shared_prefix_tokens": 1000,
            }
        )
        t0 = time.perf_counter()
        predictor.predict_table(table)
        return len(table) / (time.perf_counter() - t0)
    except ImportError:  # pragma: no cover - pandas is a dependency
        return None


def _train_wall_s(train_trace: str | None) -> tuple[float | None, str | None]:
    """Wall time of `lpc train --trace` in a fresh process (imports included, as a user
    waits for them), and the command as printed; (None, None) without a trace."""
    if train_trace is None:
        return None, None
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            sys.executable,
            "-m",
            "lpc.cli",
            "train",
            "--trace",
            train_trace,
            "--out",
            str(Path(tmp) / "model"),
            "--json",
        ]
        command = " ".join(["lpc", *argv[3:-3], "--out", "DIR", "--json"])
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        return time.perf_counter() - t0, command


def summary_lines(result: AccessBenchResult) -> list[str]:
    """The figures as text, one per line."""
    lines = [
        f"model {result.model}: {result.features} features, hidden {result.hidden_sizes}",
        f"  load (read, sha256, parse; no torch)   {result.load_ms_median:10.2f} ms",
        f"  batched forward pass ({result.batch_size}/batch)     "
        f"{result.batched_requests_per_s:10,.0f} requests/s",
        f"  one row, forward pass only             {result.one_forward_us_median:10.1f} µs",
        f"  one request from engine state          {result.one_request_us_median:10.1f} µs "
        f"(p99 {result.one_request_us_p99:.1f})",
    ]
    if result.table_features_requests_per_s is not None:
        lines.append(
            f"  request table → features → p          "
            f"{result.table_features_requests_per_s:10,.0f} requests/s"
        )
    if result.train_wall_s is not None:
        lines.append(f"  {result.train_command}: {result.train_wall_s:.1f} s wall")
    lines.append(f"  load average {result.load_average:.1f}")
    return lines
