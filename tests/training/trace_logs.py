"""Small synthetic request traces for the daily job, written in Mooncake, Bailian and the
project's JSONL formats from the same chats.

Whether a user comes back within a few minutes depends on the reply's length: after a short
reply the user answers at once (tens of seconds), after a long one they are gone for an hour
(or for good). `flipped_before_s` reverses that rule for replies before a time, so a model
fitted on the earlier part learns the opposite of what the later part shows.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path

SHORT_REPLY_TOKENS = 100


@dataclass(frozen=True)
class TraceRequest:
    conversation: int
    turn: int
    arrival_s: float
    completion_s: float
    input_length: int
    output_length: int


def chats(
    span_s: float,
    conversations: int,
    seed: int = 0,
    flipped_before_s: float = 0.0,
    start_s: float = 0.0,
) -> list[TraceRequest]:
    """Requests sorted by arrival, all within [start_s, start_s + span_s)."""
    rng = random.Random(seed)
    requests = []
    for c in range(conversations):
        t = start_s + rng.uniform(0, span_s - 600)
        context = rng.randint(520, 900)  # the first prompt fills a 512-token block at least
        for k in range(rng.randint(1, 6)):
            output = rng.choice((rng.randint(10, 60), rng.randint(200, 400)))
            done = t + 1.0 + 0.01 * output
            requests.append(TraceRequest(c, k, t, done, context, output))
            short = output < SHORT_REPLY_TOKENS
            if t - start_s < flipped_before_s:
                short = not short
            think_s = rng.expovariate(1 / 30) if short else rng.expovariate(1 / 3600)
            t = done + think_s
            context += output + rng.randint(20, 200)
    requests.sort(key=lambda r: (r.arrival_s, r.conversation, r.turn))
    return [r for r in requests if r.arrival_s < start_s + span_s]


def _block_ids(request: TraceRequest, block_size: int) -> list[int]:
    """Prefix hashes: a conversation's full blocks keep their id from turn to turn, a partial
    last block gets one of its own (its content changes on the next turn)."""
    full, partial = divmod(request.input_length, block_size)
    base = request.conversation * 1_000_000
    return [base + j for j in range(full)] + ([base + 500_000 + request.turn] if partial else [])


def _write(path: Path, records: list[dict], compress: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return path


def write_mooncake(path: Path, requests: list[TraceRequest], compress: bool = False) -> Path:
    records = [
        {
            "timestamp": round(r.arrival_s * 1000),
            "input_length": r.input_length,
            "output_length": r.output_length,
            "hash_ids": _block_ids(r, 512),
        }
        for r in requests
    ]
    return _write(path, records, compress)


def write_bailian(path: Path, requests: list[TraceRequest], compress: bool = False) -> Path:
    records = [
        {
            "chat_id": r.conversation * 100 + r.turn,
            "parent_chat_id": -1 if r.turn == 0 else r.conversation * 100 + r.turn - 1,
            "timestamp": round(r.arrival_s, 3),
            "input_length": r.input_length,
            "output_length": r.output_length,
            "type": "text",
            "turn": r.turn + 1,
            "hash_ids": _block_ids(r, 16),
        }
        for r in requests
    ]
    return _write(path, records, compress)


def write_lpc(path: Path, requests: list[TraceRequest], compress: bool = False) -> Path:
    """The project's JSONL (block-hash form, 16-token blocks); times as given (absolute
    epoch seconds when the chats were generated from an epoch `start_s`)."""
    header = {"format": "lpc-trace", "version": 1, "hash_block_size": 16}
    records = [header] + [
        {
            "conversation_id": f"c{r.conversation}",
            "arrival_s": r.arrival_s,
            "completion_s": r.completion_s,
            "input_length": r.input_length,
            "output_length": r.output_length,
            "hash_ids": _block_ids(r, 16),
        }
        for r in requests
    ]
    return _write(path, records, compress)


WRITERS = {"mooncake": write_mooncake, "bailian": write_bailian, "lpc": write_lpc}
