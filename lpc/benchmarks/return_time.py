"""How long the return-time predictor takes per release, in the caller's own process.

Two paths, each timed over real feature rows: one release at a time from an engine's state
(`ReturnTimePredictor.curve_one`: the features computed from `RequestState` and
`ConversationState`, the forward pass, the survival curve and its `ReturnCurve`), and a batch
of rows (`survival`). Plus the evictor's question on the curve (`p_return_within`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from predictor.access_features import ConversationState, RequestState
from predictor.return_time import ReturnTimePredictor


@dataclass(frozen=True)
class ReturnBench:
    one_release_us: float  # curve_one, median of the repeats
    batched_us_per_row: float
    p_return_within_us: float
    rows: int
    repeats: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _states(count: int, seed: int) -> list[tuple[RequestState, ConversationState]]:
    """Releases of a conversation's second to fifth turn, sizes and gaps drawn at random."""
    rng = np.random.default_rng(seed)
    states = []
    for _ in range(count):
        conversation = ConversationState()
        now = 0.0
        for _turn in range(int(rng.integers(1, 5))):
            prompt = int(rng.integers(500, 20_000))
            request = RequestState(
                now, prompt, int(prompt * 0.8), int(rng.integers(10, 800)), now + 5.0
            )
            conversation = conversation.after(request)
            now += 5.0 + float(rng.exponential(60.0))
        prompt = int(rng.integers(500, 20_000))
        states.append(
            (
                RequestState(now, prompt, int(prompt * 0.8), int(rng.integers(10, 800)), now + 5.0),
                conversation,
            )
        )
    return states


def bench_return_predictor(
    predictor: ReturnTimePredictor, features: np.ndarray, repeats: int = 5, seed: int = 0
) -> ReturnBench:
    states = _states(min(len(features), 2000), seed)
    one = []
    for _ in range(repeats):
        started = time.perf_counter()
        curves = [predictor.curve_one(r, c) for r, c in states]
        one.append((time.perf_counter() - started) / len(states))
    batched = []
    for _ in range(repeats):
        started = time.perf_counter()
        predictor.survival(features)
        batched.append((time.perf_counter() - started) / len(features))
    asks = []
    for _ in range(repeats):
        started = time.perf_counter()
        for curve in curves:
            curve.p_return_within(60.0, 180.0)
        asks.append((time.perf_counter() - started) / len(curves))
    return ReturnBench(
        float(np.median(one)) * 1e6,
        float(np.median(batched)) * 1e6,
        float(np.median(asks)) * 1e6,
        len(features),
        repeats,
    )
