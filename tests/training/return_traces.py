"""Small request traces for the return-time trainer's refusals and its validation slice."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.lpc.traces.helpers import bundled_lines, write_lines


def gap_trace(
    path: Path,
    gap_s: tuple[float, float] = (100.0, 520.0),
    end_s: float = 1000.0,
    conversations: int = 30,
    seed: int = 0,
) -> Path:
    """An LPC trace of `conversations` chats (40 new prompt tokens a turn, a 2-s reply,
    exponential think times of mean 40 s) with no arrival in `gap_s`. At --split-at 0.5 the
    cut falls near 500 s, inside the gap, so the training part's last 30 % of its span
    (350-500 s) holds no release: the small valid trace on which the trainer crashed."""
    rng = random.Random(seed)
    records = []
    for c in range(conversations):
        t = 0.0 if c == 0 else rng.uniform(0.0, end_s)
        tokens: list[int] = []
        while t < end_s:
            if gap_s[0] <= t < gap_s[1]:
                t = gap_s[1] + rng.uniform(0.0, 30.0)
                continue
            tokens = tokens + [rng.randrange(1000) for _ in range(40)]
            output = [rng.randrange(1000) for _ in range(8)]
            records.append(
                {
                    "conversation_id": f"c{c}",
                    "arrival_s": round(t, 3),
                    "completion_s": round(t + 2.0, 3),
                    "prompt_token_ids": tokens,
                    "output_token_ids": output,
                }
            )
            tokens = tokens + output
            t += 2.0 + rng.expovariate(1 / 40.0)
    records.sort(key=lambda r: r["arrival_s"])
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def one_instant_trace(path: Path, requests: int = 300) -> Path:
    """The bundled Mooncake trace's first requests, every one arriving at the same instant."""
    records = [json.loads(line) for line in bundled_lines()[:requests]]
    for record in records:
        record["timestamp"] = 1000
    return write_lines(path, records)


def mooncake_slice(path: Path, requests: int) -> Path:
    """The bundled Mooncake trace's first `requests` requests (no return before 200 of them)."""
    return write_lines(path, bundled_lines()[:requests])
