"""Synthetic multi-turn conversations with the prefix property of real chat templates."""

from __future__ import annotations

import random

from lpc.workload import ScriptedTurn, compact_tokens


def conversations(count: int, seed: int = 0, max_turns: int = 6) -> list[list[ScriptedTurn]]:
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(40)]
    out = []
    for c in range(count):
        cid = f"c{c}"
        num_turns = rng.randint(1, max_turns)
        history = list(system) if rng.random() < 0.5 else []
        turns = []
        prompts: list[str] = []
        for k in range(num_turns):
            prompt = history + [rng.randrange(1000) for _ in range(rng.randint(10, 300))]
            output = [rng.randrange(1000) for _ in range(rng.randint(5, 200))]
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
