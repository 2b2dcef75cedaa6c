"""The request stream `lpc bench cache-policy` drives through vLLM's CPU offload tier.

A seeded multi-turn chat stream at chunk granularity: each conversation's next turn repeats
the previous turn's chunks and appends a few new ones (so a request hits a prefix of the CPU
tier and stores its tail), conversations come back with Zipf-like popularity, and every
request carries a probability and a conversation (what `LPCCachePolicy` reads from
`kv_transfer_params`). Requests overlap: each finishes `in_flight` arrivals after its own, so
loads pin chunks while other requests store and evict. Pure Python, no vLLM: the same plan
goes, as JSON, to every policy's worker (`cache_policy_worker`, in vLLM's venv).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class PlanRequest:
    request_id: str
    conversation_id: str
    probability: float
    time_s: float
    keys: list[int]  # the prompt's chunks, head first: a prefix of the next turn's


@dataclass(frozen=True)
class CachePolicyPlan:
    num_chunks: int  # the CPU tier's capacity
    in_flight: int  # a request finishes after this many later arrivals
    requests: list[PlanRequest]

    @property
    def chunk_references(self) -> int:
        return sum(len(r.keys) for r in self.requests)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CachePolicyPlan:
        return cls(
            data["num_chunks"], data["in_flight"], [PlanRequest(**r) for r in data["requests"]]
        )


def make_plan(
    num_requests: int,
    num_chunks: int = 2000,
    conversations: int = 400,
    max_chunks_per_request: int = 48,
    in_flight: int = 8,
    seed: int = 0,
) -> CachePolicyPlan:
    """`num_requests` requests over `conversations` concurrent conversations, each turn
    1-6 chunks longer than the last; a conversation that reaches `max_chunks_per_request`
    is replaced by a new one (fresh keys), as a chat that ends."""
    if num_requests <= 0 or num_chunks <= 0 or conversations <= 0 or in_flight < 0:
        raise ValueError("the plan's sizes must be positive (in_flight >= 0)")
    rng = random.Random(seed)
    next_key = 0
    next_conversation = 0
    slots: list[tuple[str, list[int]]] = []
    for _ in range(conversations):
        slots.append((f"c{next_conversation}", []))
        next_conversation += 1
    weights = [1.0 / (i + 1) ** 0.8 for i in range(conversations)]
    requests: list[PlanRequest] = []
    time_s = 0.0
    for i in range(num_requests):
        slot = rng.choices(range(conversations), weights)[0]
        conversation, keys = slots[slot]
        grow = rng.randint(1, 6)
        if len(keys) + grow > max_chunks_per_request:
            conversation, keys = f"c{next_conversation}", []
            next_conversation += 1
        keys = keys + list(range(next_key, next_key + grow))
        next_key += grow
        slots[slot] = (conversation, keys)
        time_s += rng.expovariate(10.0)
        requests.append(
            PlanRequest(f"r{i}", conversation, round(rng.random(), 4), round(time_s, 4), keys)
        )
    return CachePolicyPlan(num_chunks, in_flight, requests)
