"""The operation stream and per-step records shared by our replay and vLLM's.

A stream is JSON lines: a `config` record (pool size, block size), then `new` and `free`
operations. Replaying it yields one `StepRecord` per operation, in the same JSON shape on both
sides, so two replays can be compared field by field. Standard library only: the vLLM driver
imports this module inside vLLM's venv.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class StreamStart:
    """Starts a stream (its `config` line): a fresh, empty pool of `num_blocks` blocks (block 0
    is the null block)."""

    name: str
    num_blocks: int
    block_size: int


@dataclass(frozen=True, slots=True)
class NewRequest:
    """A request arrives with its prompt and the output it will produce.

    The prompt is looked up in the prefix cache; blocks are then allocated for prompt and output
    together and every full block is cached.
    """

    request_id: str
    prompt: tuple[int, ...]
    output: tuple[int, ...] = ()
    cache_salt: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)


@dataclass(frozen=True, slots=True)
class FreeRequest:
    """A request finishes and releases its blocks (a no-op if its allocation failed)."""

    request_id: str


Op = StreamStart | NewRequest | FreeRequest


@dataclass(slots=True)
class Stream:
    """One replayable stream: its configuration and operations."""

    config: StreamStart
    ops: list[NewRequest | FreeRequest] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one operation did, plus the pool's state after it.

    `block_ids` is the request's whole block table (hits first) or None when the allocation
    failed; `hit_tokens` is the lookup's hit, reported even when the allocation then failed;
    `evicted` lists the blocks whose cached hash was dropped because the allocation reused them;
    `held` says whether a freed request held blocks. `free_queue` is the eviction order after the
    step and `cached` the sorted ids of the blocks that hold a hash.
    """

    stream: str
    step: int
    op: str
    request_id: str | None
    hit_tokens: int | None
    block_ids: tuple[int, ...] | None
    evicted: tuple[int, ...]
    held: bool | None
    free_queue: tuple[int, ...]
    cached: tuple[int, ...]

    @property
    def failed(self) -> bool:
        return self.op == "new" and self.block_ids is None

    def to_json(self) -> str:
        return json.dumps(
            {
                "stream": self.stream,
                "step": self.step,
                "op": self.op,
                "id": self.request_id,
                "hit_tokens": self.hit_tokens,
                "block_ids": None if self.block_ids is None else list(self.block_ids),
                "evicted": list(self.evicted),
                "held": self.held,
                "free_queue": list(self.free_queue),
                "cached": list(self.cached),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, line: str) -> StepRecord:
        d = json.loads(line)
        blocks = d["block_ids"]
        return cls(
            stream=d["stream"],
            step=d["step"],
            op=d["op"],
            request_id=d["id"],
            hit_tokens=d["hit_tokens"],
            block_ids=None if blocks is None else tuple(blocks),
            evicted=tuple(d["evicted"]),
            held=d["held"],
            free_queue=tuple(d["free_queue"]),
            cached=tuple(d["cached"]),
        )


# Fields compared between two replays, in the order a difference is reported.
COMPARED_FIELDS = (
    "op",
    "request_id",
    "hit_tokens",
    "block_ids",
    "evicted",
    "held",
    "free_queue",
    "cached",
)
# What a caller of the block manager observes, without its internal state.
OUTCOME_FIELDS = ("op", "request_id", "hit_tokens", "block_ids", "evicted", "held")


def first_difference(
    ours: StepRecord, theirs: StepRecord, fields: Sequence[str] = COMPARED_FIELDS
) -> str | None:
    """The first of `fields` on which two records of the same step differ, or None."""
    for name in fields:
        if getattr(ours, name) != getattr(theirs, name):
            return name
    return None


def op_to_dict(op: Op) -> dict[str, Any]:
    if isinstance(op, StreamStart):
        return {
            "op": "config",
            "stream": op.name,
            "num_blocks": op.num_blocks,
            "block_size": op.block_size,
        }
    if isinstance(op, NewRequest):
        d: dict[str, Any] = {
            "op": "new",
            "id": op.request_id,
            "prompt": list(op.prompt),
            "output": list(op.output),
        }
        if op.cache_salt is not None:
            d["cache_salt"] = op.cache_salt
        return d
    if isinstance(op, FreeRequest):
        return {"op": "free", "id": op.request_id}
    raise TypeError(f"not an operation: {op!r}")


def op_from_dict(d: dict[str, Any]) -> Op:
    kind = d.get("op")
    if kind == "config":
        return StreamStart(str(d["stream"]), int(d["num_blocks"]), int(d["block_size"]))
    if kind == "new":
        return NewRequest(
            str(d["id"]),
            _tokens(d["prompt"], "prompt"),
            _tokens(d.get("output", []), "output"),
            d.get("cache_salt"),
        )
    if kind == "free":
        return FreeRequest(str(d["id"]))
    raise ValueError(f"unknown operation {kind!r} in {d!r}")


def _tokens(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise ValueError(f"{what} must be a list of non-negative ints, got {value!r}")
    return tuple(value)


def streams_to_jsonl(streams: Iterable[Stream]) -> str:
    """Streams as JSON lines, each starting with its `config` record."""
    lines = []
    for stream in streams:
        lines.append(json.dumps(op_to_dict(stream.config), separators=(",", ":")))
        lines.extend(json.dumps(op_to_dict(op), separators=(",", ":")) for op in stream.ops)
    return "\n".join(lines) + "\n"


def read_streams(lines: Iterable[str]) -> Iterator[Stream]:
    """Parse JSON lines back into streams; blank lines are ignored."""
    current: Stream | None = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            op = op_from_dict(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"line {number}: {exc}") from None
        if isinstance(op, StreamStart):
            if current is not None:
                yield current
            current = Stream(op)
        elif current is None:
            raise ValueError(f"line {number}: an operation before the first config record")
        else:
            current.ops.append(op)
    if current is not None:
        yield current
