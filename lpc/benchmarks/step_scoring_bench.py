"""The in-process access model's cost per scheduler step: one forward pass for the requests a
step finishes (`AccessRuntime.release_many`, what the LPC scheduler class runs) against one
per request (`AccessRuntime.release`, what a release scored alone runs).

Both sides read the same requests (vLLM-like, duck-typed as in `release_bench`), each with its
own conversation table, steps interleaved; each includes what the release computes and
records besides the p (the conversation's state, the shared prefix, the table's update).
Timer: the thread's CPU time, garbage collector off. With `cold`, a 32 MiB buffer is read
before each side's step, so the model's weights and the table come from memory, as in an
engine where a step's other work runs between two releases.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lpc.benchmarks.release_bench import Conversation
from lpc.integrations.access_runtime import AccessRuntime, ReleaseItem, load_access_runtime
from lpc.integrations.config import PluginConfig
from lpc.integrations.stats import PluginStats

DEFAULT_FINISHED = (1, 2, 4, 16, 64)  # requests a step finishes
THINK_S = 30.0  # between a conversation's requests


@dataclass(frozen=True)
class StepScoringFigure:
    """Scoring `finished` requests in one step (µs of the scheduler thread's CPU, p50 over
    the steps)."""

    finished: int
    steps: int
    one_by_one_us: float
    one_call_us: float
    ratio: float  # one call / one by one
    one_call_per_request_us: float
    calls_one_by_one: int  # the model's forward passes on each side
    calls_one_call: int


def _runtime(model: Path, block_size: int) -> tuple[AccessRuntime, PluginStats]:
    stats = PluginStats()
    runtime = load_access_runtime(PluginConfig(access_model=str(model)), stats)
    if runtime is None or runtime.model is None:
        raise ValueError(f"{model}: no access model loaded")
    runtime.block_size = block_size  # what the plugin reads from vLLM's BlockPool
    return runtime, stats


def run_finished(
    model: Path,
    finished: int,
    steps: int,
    tokens: int = 2_048,
    block_size: int = 16,
    cold: bool = False,
    seed: int = 0,
) -> StepScoringFigure:
    """`steps` steps that each finish `finished` requests of distinct conversations."""
    rng = random.Random(seed)
    chats = [Conversation(f"c{i}", tokens, block_size, rng) for i in range(max(finished, 8))]
    alone, alone_stats = _runtime(model, block_size)
    batched, batched_stats = _runtime(model, block_size)
    buffer = np.ones(4 << 20) if cold else None  # 32 MiB
    ns: dict[str, list[int]] = {"alone": [], "batched": []}
    now = 1_000.0
    turn = 0
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for step in range(steps):
            now += THINK_S
            items = []
            for _ in range(finished):
                chat = chats[turn % len(chats)]
                turn += 1
                request = chat.next_request(now - 5.0)
                items.append(ReleaseItem(request, chat.name, now, request.num_prompt_tokens))
            for side in ("alone", "batched") if step % 2 else ("batched", "alone"):
                if buffer is not None:
                    buffer.sum()
                start = time.thread_time_ns()
                if side == "alone":
                    for item in items:
                        alone.release(*item[:4])
                else:
                    batched.release_many(items)
                ns[side].append(time.thread_time_ns() - start)
    finally:
        if gc_was_enabled:
            gc.enable()
    one_by_one = statistics.median(ns["alone"]) / 1e3
    one_call = statistics.median(ns["batched"]) / 1e3
    return StepScoringFigure(
        finished=finished,
        steps=steps,
        one_by_one_us=one_by_one,
        one_call_us=one_call,
        ratio=one_call / one_by_one,
        one_call_per_request_us=one_call / finished,
        calls_one_by_one=alone_stats.in_process_scoring_calls,
        calls_one_call=batched_stats.in_process_scoring_calls,
    )


def run(
    model: Path,
    finished: Sequence[int] = DEFAULT_FINISHED,
    steps: int = 200,
    cold: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[StepScoringFigure]:
    figures = []
    for n in finished:
        if progress is not None:
            progress(f"step scoring: {n} finished requests a step, {steps} steps")
        figures.append(run_finished(model, n, steps, cold=cold))
    return figures
