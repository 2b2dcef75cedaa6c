"""Seeded random request streams for block-manager tests.

Multi-turn conversations (the next prompt extends the previous prompt and output exactly),
shared system prompts across conversations, cache salts, lengths not aligned to the block
size, random continuation probabilities (some missing) and frees in random order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from lpc.blocks.block_manager import CacheRequest


@dataclass(frozen=True)
class Allocate:
    request: CacheRequest
    now_s: float


@dataclass(frozen=True)
class Free:
    request_id: str
    now_s: float
    probability: float | None


def random_stream(
    seed: int,
    num_steps: int,
    max_in_flight: int = 6,
    salts: tuple[str | None, ...] = (None, None, "tenant-a", "tenant-b"),
    vocab: int = 50,
) -> list[Allocate | Free]:
    rng = random.Random(seed)
    system_prompts = [[rng.randrange(vocab) for _ in range(rng.randint(3, 20))] for _ in range(3)]
    history: dict[str, list[int]] = {}
    salt_of: dict[str, str | None] = {}
    in_flight: dict[str, str] = {}  # request id -> conversation id
    busy: set[str] = set()
    steps: list[Allocate | Free] = []
    now = 0.0
    counter = 0
    while len(steps) < num_steps:
        now += rng.expovariate(1.0)
        if in_flight and (len(in_flight) >= max_in_flight or rng.random() < 0.45):
            rid = rng.choice(sorted(in_flight))
            busy.discard(in_flight.pop(rid))
            p = None if rng.random() < 0.1 else rng.random()
            steps.append(Free(rid, now, p))
            continue
        idle = sorted(set(history) - busy)
        if idle and rng.random() < 0.6:
            conv = rng.choice(idle)
        else:
            conv = f"conv{len(history)}"
            history[conv] = list(rng.choice(system_prompts))
            salt_of[conv] = rng.choice(salts)
        prompt = history[conv] + [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
        output = [rng.randrange(vocab) for _ in range(rng.randint(1, 10))]
        history[conv] = prompt + output
        counter += 1
        rid = f"req{counter}"
        request = CacheRequest(
            rid, prompt + output, len(prompt), conversation_id=conv, cache_salt=salt_of[conv]
        )
        in_flight[rid] = conv
        busy.add(conv)
        steps.append(Allocate(request, now))
    return steps
