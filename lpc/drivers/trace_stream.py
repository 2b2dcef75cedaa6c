"""A request trace as the operation stream and release plan the vLLM driver replays.

Our A/B replay (`lpc.replay.simulator.replay`) walks a prepared workload's events in order: at an
arrival it looks the prompt up and allocates prompt and output, at a completion it frees with
the request's probability. The same events, turned into `lpc.difftest` operations with the
events' times and the trace's probabilities and conversation ids as a `ReleasePlan`, make
real vLLM do exactly the same, so the two hit ratios can be compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lpc.difftest.ops import FreeRequest, NewRequest, StepRecord, Stream, StreamStart
from lpc.drivers.release_plan import ReleasePlan, RequestPlan
from lpc.replay.simulator import PreparedWorkload, num_blocks_for
from lpc.workload import ARRIVAL


def trace_stream(
    workload: PreparedWorkload,
    cache_tokens: int,
    probabilities: Sequence[float | None],
    name: str = "trace",
) -> tuple[Stream, ReleasePlan]:
    """The stream of `workload`'s events on a pool of `cache_tokens`, and its release plan."""
    if len(probabilities) != len(workload.requests):
        raise ValueError(
            f"{len(probabilities)} probabilities for {len(workload.requests)} requests"
        )
    num_blocks = num_blocks_for(cache_tokens, workload.block_size)
    stream = Stream(StreamStart(name, num_blocks, workload.block_size))
    plan = ReleasePlan(times=[])
    assert plan.times is not None
    for request, probability in zip(workload.requests, probabilities, strict=True):
        if request.turn.lora_id is not None:
            raise ValueError(
                f"request {request.request_id} uses LoRA {request.turn.lora_id!r}; the vLLM "
                "replay does not load adapters"
            )
        plan.requests[request.request_id] = RequestPlan(
            probability, request.conversation_id, tuple(request.turn.user_prompts)
        )
    for time_s, kind, i in workload.events:
        request = workload.requests[i]
        if kind == ARRIVAL:
            turn = request.turn
            tokens = turn.token_ids
            stream.ops.append(
                NewRequest(
                    request.request_id,
                    tuple(tokens[: turn.num_prompt_tokens]),
                    tuple(tokens[turn.num_prompt_tokens :]),
                    turn.cache_salt,
                )
            )
        else:
            stream.ops.append(FreeRequest(request.request_id))
        plan.times.append(time_s)
    return stream, plan


@dataclass(frozen=True)
class HitTotals:
    """Token hit ratio of a replay, counted as `lpc.replay.simulator` counts it."""

    queried_tokens: int
    hit_tokens: int
    requests: int
    allocation_failures: int
    evictions: int

    @property
    def token_hit_ratio(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


def hit_totals(stream: Stream, records: Sequence[StepRecord]) -> HitTotals:
    """Hits of the requests that were allocated; a failed one counts as queried with no hit."""
    prompts = {op.request_id: len(op.prompt) for op in stream.ops if isinstance(op, NewRequest)}
    queried = hits = requests = failures = evictions = 0
    for record in records:
        if record.op != "new":
            continue
        requests += 1
        queried += prompts[record.request_id]
        evictions += len(record.evicted)
        if record.block_ids is None:
            failures += 1
        else:
            hits += record.hit_tokens or 0
    return HitTotals(queried, hits, requests, failures, evictions)
