"""Synthetic multi-turn conversations with the prefix property of real chat templates."""

from __future__ import annotations

import random

from lpc.workload import ScriptedTurn, compact_tokens


def token_ids(rng: random.Random, count: int) -> list[int]:
    """`count` draws of `rng.randrange(1000)`, drawn as it draws them (10 random bits, drawn
    again while 1000 or more), without its per-call overhead: the conversations of a test
    draw millions of tokens."""
    bits = rng.getrandbits
    out = []
    for _ in range(count):
        r = bits(10)
        while r >= 1000:
            r = bits(10)
        out.append(r)
    return out


def conversations(count: int, seed: int = 0, max_turns: int = 6) -> list[list[ScriptedTurn]]:
    rng = random.Random(seed)
    system = token_ids(rng, 40)
    out = []
    for c in range(count):
        cid = f"c{c}"
        num_turns = rng.randint(1, max_turns)
        history = list(system) if rng.random() < 0.5 else []
        turns = []
        prompts: list[str] = []
        for k in range(num_turns):
            prompt = history + token_ids(rng, rng.randint(10, 300))
            output = token_ids(rng, rng.randint(5, 200))
            prompts.append(f"prompt {k} of {cid}")
            turns.append(
                ScriptedTurn(
                    cid,
                    k,
                    compact_tokens(prompt + output),
                    len(prompt),
                    k + 1 < num_turns,
                    tuple(prompts[-5:]),
                )
            )
            history = prompt + output + [7]
        out.append(turns)
    return out
