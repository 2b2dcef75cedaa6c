"""Synthetic chat workloads by the paper's two-phase method, and the requests they produce.

Public chat datasets have no timestamps, so LPC's paper synthesises them:
1. before the run, every gap between a reply and the user's next turn is drawn from an
   exponential distribution with mean λ_chat (100 s), and conversation starts are spaced so
   that at most N_conv (200) conversations are active at once;
2. during the run, a conversation's next request arrives at the *actual* completion time of
   its previous reply plus its gap. The run lasts 20 minutes.

Here a conversation occupies one of N_conv slots from its first arrival to its last
completion; the first N_conv start spread over one mean gap (no synchronised burst), and a
freed slot takes the next conversation after an exponential pause (a new user arriving).
With the default latency model (independent of cache hits) every policy sees the identical
trace; `LatencyModel(closed_loop=True)` makes prefill time depend on the uncached tokens.
"""

from __future__ import annotations

import heapq
import math
import random
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from lpc.errors import InvalidInputError


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """Time a request takes: fixed overhead + prefill + decode.

    Defaults are of the order of a 32B model on one H100 with batching (prefill ≈ 8K
    tokens/s, ≈ 30 ms per output token). With `closed_loop` only uncached prompt tokens are
    prefilled, so cache hits shorten requests and shift every later arrival.
    """

    overhead_s: float = 0.05
    prefill_tokens_per_s: float = 8000.0
    time_per_output_token_s: float = 0.03
    closed_loop: bool = False

    def __post_init__(self) -> None:
        for name in ("overhead_s", "prefill_tokens_per_s", "time_per_output_token_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:  # a flag's value: one line, not a bug
                raise InvalidInputError(
                    f"LatencyModel.{name} must be finite and >= 0, got {value!r}"
                )
        if self.prefill_tokens_per_s == 0:
            raise InvalidInputError("LatencyModel.prefill_tokens_per_s must be > 0")

    def duration_s(
        self, num_prompt_tokens: int, num_hit_tokens: int, num_output_tokens: int
    ) -> float:
        prefilled = num_prompt_tokens - (num_hit_tokens if self.closed_loop else 0)
        return (
            self.overhead_s
            + prefilled / self.prefill_tokens_per_s
            + num_output_tokens * self.time_per_output_token_s
        )


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """The paper's workload knobs (defaults: λ_chat 100 s, N_conv 200, 20 minutes)."""

    mean_think_time_s: float = 100.0
    max_active_conversations: int = 200
    duration_s: float | None = 1200.0  # None: run until every conversation has finished
    seed: int = 0
    latency: LatencyModel = field(default_factory=LatencyModel)

    def __post_init__(self) -> None:
        if not math.isfinite(self.mean_think_time_s) or self.mean_think_time_s <= 0:
            raise ValueError(f"mean_think_time_s must be > 0, got {self.mean_think_time_s!r}")
        if self.max_active_conversations < 1:
            raise ValueError(
                f"max_active_conversations must be >= 1, got {self.max_active_conversations!r}"
            )
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0 or None, got {self.duration_s!r}")


@dataclass(slots=True)
class ScriptedTurn:
    """One user turn as the serving engine sees it: tokens, label, and predictor input."""

    conversation_id: str
    turn_index: int
    token_ids: Sequence[int]  # prompt then output
    num_prompt_tokens: int
    has_next_turn: bool
    user_prompts: tuple[str, ...] = ()  # this turn's user prompt and the ones before it
    cache_salt: str | None = None
    lora_id: str | int | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


@dataclass(slots=True)
class WorkloadRequest:
    """A turn placed in time: the unit every policy replays."""

    request_id: str
    turn: ScriptedTurn
    arrival_s: float
    completion_s: float

    @property
    def conversation_id(self) -> str:
        return self.turn.conversation_id


@dataclass(frozen=True, slots=True)
class ConversationScript:
    """A conversation's turns and the think time before each turn after the first."""

    conversation_id: str
    turns: tuple[ScriptedTurn, ...]
    think_times_s: tuple[float, ...]  # len(turns) - 1


def draw_scripts(
    conversations: Iterable[Sequence[ScriptedTurn]], config: WorkloadConfig
) -> Iterator[ConversationScript]:
    """Phase 1: draw every think time up front, from one seeded stream."""
    rng = random.Random(config.seed)
    mean = config.mean_think_time_s
    for turns in conversations:
        if not turns:
            continue
        gaps = tuple(rng.expovariate(1.0 / mean) for _ in range(len(turns) - 1))
        yield ConversationScript(turns[0].conversation_id, tuple(turns), gaps)


# Event kinds, ordered so that at equal times completions free blocks before arrivals use them
# (a request that completes at its own arrival time still completes after it arrives:
# `run_schedule` schedules a completion only once its arrival has run, and
# `lpc.replay.simulator.replay_events` orders a fixed trace's events so).
COMPLETION, ARRIVAL = 0, 1


def run_schedule(
    scripts: Iterator[ConversationScript],
    config: WorkloadConfig,
    on_arrival: Callable[[WorkloadRequest], int],
    on_completion: Callable[[WorkloadRequest], None],
) -> list[WorkloadRequest]:
    """Phase 2: place turns in time, calling back as requests arrive and complete.

    `on_arrival` returns the request's hit tokens (used only in closed loop). Returns the
    requests that arrived, in arrival order, with their completion times.
    """
    rng = random.Random(config.seed ^ 0x5EED)
    latency = config.latency
    horizon = math.inf if config.duration_s is None else config.duration_s
    events: list[tuple[float, int, int, object]] = []
    sequence = 0
    arrived: list[WorkloadRequest] = []

    def schedule(time_s: float, kind: int, payload: object) -> None:
        nonlocal sequence
        heapq.heappush(events, (time_s, kind, sequence, payload))
        sequence += 1

    def start_next(time_s: float) -> None:
        script = next(scripts, None)
        if script is not None and time_s < horizon:
            schedule(time_s, ARRIVAL, (script, 0))

    for _ in range(config.max_active_conversations):
        start_next(rng.uniform(0.0, config.mean_think_time_s))
    while events:
        time_s, kind, _, payload = heapq.heappop(events)
        if kind == ARRIVAL:
            script, index = payload  # type: ignore[misc]
            if time_s >= horizon:
                continue
            turn = script.turns[index]
            request = WorkloadRequest(f"{turn.conversation_id}#{index}", turn, time_s, math.nan)
            hit_tokens = on_arrival(request)
            request.completion_s = time_s + latency.duration_s(
                turn.num_prompt_tokens, hit_tokens, turn.num_output_tokens
            )
            arrived.append(request)
            schedule(request.completion_s, COMPLETION, (script, index, request))
        else:
            script, index, request = payload  # type: ignore[misc]
            on_completion(request)
            if index + 1 < len(script.turns):
                schedule(time_s + script.think_times_s[index], ARRIVAL, (script, index + 1))
            else:
                start_next(time_s + rng.expovariate(1.0 / config.mean_think_time_s))
    return arrived


def open_loop_requests(
    conversations: Iterable[Sequence[ScriptedTurn]], config: WorkloadConfig
) -> list[WorkloadRequest]:
    """The fixed timeline every policy replays when latency ignores cache hits."""
    if config.latency.closed_loop:
        raise ValueError("a closed-loop workload has no fixed timeline; replay it per policy")
    return run_schedule(
        draw_scripts(conversations, config), config, lambda request: 0, lambda request: None
    )


def compact_tokens(token_ids: Iterable[int]) -> array:
    """Token ids as a 4-byte array (a trace holds millions of them)."""
    return array("I", token_ids)


def observed_think_times(requests: Sequence[WorkloadRequest]) -> list[float]:
    """Gaps between a reply's completion and the same conversation's next arrival."""
    last_completion: dict[str, float] = {}
    gaps = []
    for request in sorted(requests, key=lambda r: r.arrival_s):
        previous = last_completion.get(request.conversation_id)
        if previous is not None:
            gaps.append(request.arrival_s - previous)
        last_completion[request.conversation_id] = request.completion_s
    return gaps


def estimated_scale_per_s(requests: Sequence[WorkloadRequest], default: float = 1e-2) -> float:
    """LPC's decay scale from observed think times: 1 / their mean.

    With exponential return gaps of mean μ, p·d/(p·d + 1 − p) with d = exp(−τ/μ) is exactly the
    posterior that a conversation silent for τ seconds still continues, so 1/μ is the scale the
    decay formula assumes. In a deployment the gaps come from yesterday's logs, like the
    retraining data; `default` applies when no conversation has two turns.
    """
    gaps = [g for g in observed_think_times(requests) if g > 0]
    return 1.0 / (sum(gaps) / len(gaps)) if gaps else default
