"""Replay a workload through the block manager under one policy and one cache size.

Everything that does not depend on the policy is computed once in `prepare`: block hashes
(incrementally along each conversation, since turn k+1's prompt extends turn k's sequence),
the sorted arrival/completion events, Belady's view of the future, and every probability
source's predictions. A replay is then a single pass over the events: at an arrival the
manager looks up and allocates, at a completion it frees with the turn's probability. A
request the pool cannot hold is counted as an allocation failure: it is served uncached (its
prompt counts as queried with no hit) so that the trace stays identical for every policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from eviction import FutureUses, ReturnCurveLike
from lpc.blocks.block_manager import CacheCounters, CacheRequest, PrefixCacheBlockManager
from lpc.blocks.hashing import BlockHash, BlockHasher
from lpc.integrations.request_log import FinishedRequest
from lpc.replay.policies import PolicySpec, build_evictor
from lpc.traces.expand import SyntheticTokens, synthetic_block_hashes
from lpc.workload import (
    ARRIVAL,
    COMPLETION,
    ConversationScript,
    ScriptedTurn,
    WorkloadConfig,
    WorkloadRequest,
    run_schedule,
)

TurnKey = tuple[str, int]


@dataclass(frozen=True)
class PreparedWorkload:
    requests: list[WorkloadRequest]
    cache_requests: list[CacheRequest]
    events: list[tuple[float, int, int]]  # (time, kind, request index), in replay order
    future: FutureUses
    block_size: int
    probabilities: dict[str, list[float | None]]  # source name -> one per request
    # Hit ratios count requests from this index on (a trace's evaluation part); earlier ones
    # only warm the cache.
    first_counted: int = 0
    # Each request's workload category (request type x turn), passed with its release; None:
    # releases carry no category.
    categories: list[str] | None = None
    # curve source name -> one return curve per request (the `lpc-return` evictor's input)
    curves: dict[str, list[ReturnCurveLike | None]] = field(default_factory=dict)

    @cached_property
    def counted_conversations(self) -> np.ndarray:
        """Each counted request's conversation, as codes 0..k-1 (computed once per workload,
        not once per replay)."""
        ids = [r.conversation_id for r in self.requests[self.first_counted :]]
        if not ids:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.asarray(ids, dtype=object).astype(str), return_inverse=True)[1]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(r.num_prompt_tokens for r in self.cache_requests[self.first_counted :])

    @property
    def peak_in_flight_tokens(self) -> int:
        """The most tokens requests hold at once (arrival to completion): a cache smaller
        than this cannot even hold the running requests, let alone a prefix cache."""
        held = peak = 0
        for _, kind, i in self.events:
            if kind == ARRIVAL:
                held += len(self.cache_requests[i].token_ids)
                peak = max(peak, held)
            else:
                held -= len(self.cache_requests[i].token_ids)
        return peak


def hash_turns(requests: Sequence[WorkloadRequest], hasher: BlockHasher) -> list[list[BlockHash]]:
    """Block hashes of every request, reusing the previous turn's when it is a prefix.

    Requests expanded from a trace's block ids are hashed per distinct trace block instead
    (`lpc.traces.expand`): the same hashes, without touching each token.
    """
    if requests and all(isinstance(r.turn.token_ids, SyntheticTokens) for r in requests):
        if any(r.turn.cache_salt or r.turn.lora_id is not None for r in requests):
            raise ValueError("trace requests expanded from block ids carry no salt or LoRA")
        return synthetic_block_hashes([r.turn.token_ids for r in requests], hasher)
    previous: dict[str, tuple[Sequence[int], list[BlockHash]]] = {}
    out: list[list[BlockHash]] = []
    for request in requests:
        turn = request.turn
        start: list[BlockHash] = []
        prior = previous.get(turn.conversation_id)
        if prior is not None:
            tokens, hashes = prior
            if turn.token_ids[: len(tokens)] == tokens:
                start = hashes
        hashes = hasher.hash_sequence(
            turn.token_ids, turn.cache_salt, turn.lora_id, start_hashes=start
        )
        previous[turn.conversation_id] = (turn.token_ids, hashes)
        out.append(hashes)
    return out


def replay_events(requests: Sequence[WorkloadRequest]) -> list[tuple[float, int, int]]:
    """Arrivals and completions, `(time, kind, request index)`, in the order a replay walks
    them: by time; at equal times, requests that arrived earlier complete (freeing their
    blocks) before new ones arrive, and arrivals go in request order.

    A request may complete at its own arrival time (a trace allows completion_s ==
    arrival_s; a latency far below the clock's resolution rounds to it): it completes right
    after it arrives, before the next arrival, never before its own arrival, since a
    completion frees blocks its arrival allocated."""
    events = [(r.arrival_s, ARRIVAL, i) for i, r in enumerate(requests)] + [
        (r.completion_s, COMPLETION, i) for i, r in enumerate(requests)
    ]
    if not any(r.completion_s == r.arrival_s for r in requests):
        return sorted(events)  # the common case, without the cost of a key per event

    def order(event: tuple[float, int, int]) -> tuple[float, int, int, int]:
        time_s, kind, i = event
        if kind == COMPLETION and requests[i].arrival_s == time_s:
            return (time_s, ARRIVAL, i, 1)  # right after its own arrival
        return (time_s, kind, i, 0)

    return sorted(events, key=order)


def prepare(
    requests: list[WorkloadRequest],
    block_size: int,
    probabilities: Mapping[str, list[float | None]],
    hash_algorithm: str = "sha256",
    first_counted: int = 0,
    categories: list[str] | None = None,
    curves: Mapping[str, list[ReturnCurveLike | None]] | None = None,
) -> PreparedWorkload:
    """Everything policy-independent, once. Requests [0, first_counted) warm the cache but
    are not counted in hit ratios; `categories` (one per request) tag their releases."""
    hasher = BlockHasher(block_size, hash_algorithm)
    hashes = hash_turns(requests, hasher)
    cache_requests = [
        CacheRequest(
            request.request_id,
            request.turn.token_ids,
            request.turn.num_prompt_tokens,
            conversation_id=request.conversation_id,
            cache_salt=request.turn.cache_salt,
            lora_id=request.turn.lora_id,
            block_hashes=block_hashes,
        )
        for request, block_hashes in zip(requests, hashes, strict=True)
    ]
    events = replay_events(requests)
    future = FutureUses()
    for request, block_hashes in zip(requests, hashes, strict=True):
        hit_blocks = (request.turn.num_prompt_tokens - 1) // block_size
        future.add(request.arrival_s, block_hashes[:hit_blocks])
    for name, values in probabilities.items():
        if len(values) != len(requests):
            raise ValueError(f"source {name!r} gave {len(values)} predictions for {len(requests)}")
    if categories is not None and len(categories) != len(requests):
        raise ValueError(f"{len(categories)} categories for {len(requests)} requests")
    for name, values in (curves or {}).items():
        if len(values) != len(requests):
            raise ValueError(f"curve source {name!r} gave {len(values)} curves for {len(requests)}")
    return PreparedWorkload(
        requests,
        cache_requests,
        events,
        future,
        block_size,
        dict(probabilities),
        first_counted,
        categories,
        dict(curves or {}),
    )


@dataclass(frozen=True)
class RequestHits:
    """Per counted request, in arrival order: its prefix-cache hit tokens and its
    conversation (an index into the counted conversations). What a paired bootstrap over
    conversations resamples (`lpc.replay.intervals`); queried tokens are the same for every
    policy of one workload, so they cancel out of a ratio of hit ratios."""

    hit_tokens: np.ndarray  # int64, one per counted request
    conversations: np.ndarray  # int64 codes, one per counted request


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    cache_tokens: int
    num_blocks: int
    requests: int
    queried_tokens: int
    hit_tokens: int
    hit_requests: int
    evictions: int
    allocation_failures: int
    seconds: float
    # Per-request hits (open-loop replays; None in a closed loop, whose timelines differ by
    # policy). Not part of the figures: left out of `to_dict`.
    per_request: RequestHits | None = field(default=None, compare=False, repr=False)

    @property
    def token_hit_ratio(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def request_hit_ratio(self) -> float:
        return self.hit_requests / self.requests if self.requests else 0.0

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "per_request"}
        d["token_hit_ratio"] = self.token_hit_ratio
        d["request_hit_ratio"] = self.request_hit_ratio
        return d


def _result(
    spec: PolicySpec,
    cache_tokens: int,
    manager: PrefixCacheBlockManager,
    failed_prompt_tokens: int,
    started: float,
    baseline: CacheCounters | None = None,
    per_request: RequestHits | None = None,
) -> ReplayResult:
    """Counters of a finished replay, minus `baseline` (the counters when counting began);
    failed requests count as queried with no hit."""
    c: CacheCounters = manager.counters
    b = baseline or CacheCounters()
    failures = c.allocation_failures - b.allocation_failures
    return ReplayResult(
        policy=spec.label,
        cache_tokens=cache_tokens,
        num_blocks=manager.num_blocks,
        requests=c.requests - b.requests + failures,
        queried_tokens=c.queried_tokens - b.queried_tokens + failed_prompt_tokens,
        hit_tokens=c.hit_tokens - b.hit_tokens,
        hit_requests=c.hit_requests - b.hit_requests,
        evictions=c.evictions - b.evictions,
        allocation_failures=failures,
        seconds=time.perf_counter() - started,
        per_request=per_request,
    )


def num_blocks_for(cache_tokens: int, block_size: int) -> int:
    """Blocks of a pool holding `cache_tokens` tokens, plus vLLM's null block."""
    if cache_tokens < block_size:
        raise ValueError(f"cache of {cache_tokens} tokens holds no {block_size}-token block")
    return cache_tokens // block_size + 1


def request_curves(
    workload: PreparedWorkload, spec: PolicySpec
) -> Sequence[ReturnCurveLike | None] | None:
    """The return curve each request releases its blocks with under `spec` (None: the
    policy reads none)."""
    if spec.curve_source is None:
        return None
    try:
        return workload.curves[spec.curve_source]
    except KeyError:
        raise ValueError(
            f"policy {spec.label!r} needs the {spec.curve_source!r} return curves, "
            f"which this workload was not prepared with"
        ) from None


def request_probabilities(workload: PreparedWorkload, spec: PolicySpec) -> Sequence[float | None]:
    """The probability each request releases its blocks with under `spec`: none for a
    heuristic, the constant of lpc-const, else the prepared source's predictions."""
    if spec.source is None:
        return [None] * len(workload.requests)
    if spec.source == "const":
        return [spec.constant] * len(workload.requests)
    try:
        return workload.probabilities[spec.source]
    except KeyError:
        raise ValueError(
            f"policy {spec.label!r} needs the {spec.source!r} probability source, "
            f"which this workload was not prepared with"
        ) from None


def replay(
    workload: PreparedWorkload,
    spec: PolicySpec,
    cache_tokens: int,
    scale_per_s: float = 1e-2,
    fallback_probability: float = 0.5,
    request_log: RequestLogSink | None = None,
    policy_options: Mapping[str, Any] | None = None,
) -> ReplayResult:
    """One policy at one cache size. With `request_log`, every finished request is appended
    to it as a serving engine would log it (times, tokens, hits, probability, block hashes).
    `policy_options` are a fitted policy's constants (`lpc.replay.fitted_policies`)."""
    started = time.perf_counter()
    num_blocks = num_blocks_for(cache_tokens, workload.block_size)
    evictor = build_evictor(
        spec, num_blocks, scale_per_s, fallback_probability, workload.future, policy_options
    )
    manager = PrefixCacheBlockManager(num_blocks, workload.block_size, evictor=evictor)
    probabilities = request_probabilities(workload, spec)
    curves = request_curves(workload, spec)
    cache_requests = workload.cache_requests
    categories: Sequence[str | None] = workload.categories or [None] * len(cache_requests)
    failed_prompt_tokens = 0
    failed: set[int] = set()
    hit_tokens: dict[int, int] = {}
    first_counted = workload.first_counted
    counted_hits = np.zeros(max(0, len(cache_requests) - first_counted), dtype=np.int64)
    baseline: CacheCounters | None = None if first_counted else CacheCounters()
    for time_s, kind, i in workload.events:
        request = cache_requests[i]
        if kind == ARRIVAL:
            if baseline is None and i >= first_counted:
                # Requests are in arrival order: every later arrival is counted.
                baseline = replace(manager.counters)
            prefix = manager.find_computed_prefix(request, request.block_hashes)
            allocation = manager.allocate(request, prefix, time_s)
            if allocation is None:
                failed.add(i)
                if i >= first_counted:
                    failed_prompt_tokens += request.num_prompt_tokens
                continue
            if i >= first_counted:
                counted_hits[i - first_counted] = allocation.num_hit_tokens
            if request_log is not None:
                hit_tokens[i] = allocation.num_hit_tokens
            continue
        if i in failed:
            failed.discard(i)
        else:
            manager.free(
                request.request_id,
                time_s,
                probabilities[i],
                category=None if categories is None else categories[i],
                return_curve=None if curves is None else curves[i],
            )
        if request_log is not None:
            request_log.append(
                finished_request(
                    workload.requests[i],
                    request,
                    time_s,
                    hit_tokens.pop(i, 0),
                    probabilities[i],
                    arrival_order=i,
                )
            )
    if baseline is None:
        baseline = replace(manager.counters)
    per_request = RequestHits(counted_hits, workload.counted_conversations)
    return _result(
        spec, cache_tokens, manager, failed_prompt_tokens, started, baseline, per_request
    )


class RequestLogSink(Protocol):
    def append(self, record: FinishedRequest) -> bool: ...


def finished_request(
    request: WorkloadRequest,
    cache_request: CacheRequest,
    finish_s: float,
    hit_tokens: int,
    probability: float | None,
    arrival_order: int | None = None,
) -> FinishedRequest:
    """A replayed request as the serving engine logs it when it finishes."""
    turn = request.turn
    return FinishedRequest(  # positional: keyword arguments cost about 2 µs more
        request.request_id,
        request.arrival_s,
        finish_s,
        cache_request.num_prompt_tokens,
        hit_tokens,
        len(cache_request.token_ids) - cache_request.num_prompt_tokens,
        cache_request.block_hashes or (),
        turn.conversation_id,
        turn.turn_index,
        probability,
        None if probability is None else "model",
        None,
        turn.user_prompts or None,
        arrival_order,
    )


def replay_closed_loop(
    scripts: Iterator[ConversationScript],
    config: WorkloadConfig,
    spec: PolicySpec,
    cache_tokens: int,
    block_size: int,
    probability_of: Callable[[ScriptedTurn], float | None],
    scale_per_s: float = 1e-2,
    fallback_probability: float = 0.5,
    hash_algorithm: str = "sha256",
    policy_options: Mapping[str, Any] | None = None,
    category_of: Callable[[ScriptedTurn], str | None] = lambda turn: None,
) -> ReplayResult:
    """Replay where cache hits shorten prefill and so move every later arrival.

    The timeline is policy-dependent, so it is built during the replay; Belady, which needs
    the future of a fixed trace, is not available here. `category_of` tags each release.
    """
    if spec.evictor == "belady":
        raise ValueError("belady needs a fixed trace; it cannot run in a closed-loop replay")
    if spec.curve_source is not None:
        raise ValueError(
            f"{spec.label} reads return curves of a fixed trace; it cannot run in a "
            "closed-loop replay"
        )
    started = time.perf_counter()
    num_blocks = num_blocks_for(cache_tokens, block_size)
    evictor = build_evictor(
        spec, num_blocks, scale_per_s, fallback_probability, None, policy_options
    )
    manager = PrefixCacheBlockManager(num_blocks, block_size, evictor=evictor)
    hasher = BlockHasher(block_size, hash_algorithm)
    known: dict[str, tuple[Sequence[int], list[BlockHash]]] = {}
    failed: set[str] = set()
    failed_prompt_tokens = 0

    def on_arrival(request: WorkloadRequest) -> int:
        nonlocal failed_prompt_tokens
        turn = request.turn
        start: list[BlockHash] = []
        prior = known.get(turn.conversation_id)
        if prior is not None and turn.token_ids[: len(prior[0])] == prior[0]:
            start = prior[1]
        hashes = hasher.hash_sequence(
            turn.token_ids, turn.cache_salt, turn.lora_id, start_hashes=start
        )
        known[turn.conversation_id] = (turn.token_ids, hashes)
        cache_request = CacheRequest(
            request.request_id,
            turn.token_ids,
            turn.num_prompt_tokens,
            conversation_id=turn.conversation_id,
            cache_salt=turn.cache_salt,
            lora_id=turn.lora_id,
            block_hashes=hashes,
        )
        prefix = manager.find_computed_prefix(cache_request, hashes)
        allocation = manager.allocate(cache_request, prefix, request.arrival_s)
        if allocation is None:
            failed.add(request.request_id)
            failed_prompt_tokens += turn.num_prompt_tokens
            return 0
        return allocation.num_hit_tokens

    def on_completion(request: WorkloadRequest) -> None:
        if request.request_id in failed:
            failed.discard(request.request_id)
            return
        probability = (
            spec.constant
            if spec.source == "const"
            else None
            if spec.source is None
            else probability_of(request.turn)
        )
        manager.free(
            request.request_id, request.completion_s, probability, category_of(request.turn)
        )

    run_schedule(scripts, config, on_arrival, on_completion)
    return _result(spec, cache_tokens, manager, failed_prompt_tokens, started)
