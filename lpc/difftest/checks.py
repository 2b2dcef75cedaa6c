"""Checks on a replayed stream that need no second implementation: totals and salt isolation.

Agreement with vLLM proves we copy vLLM; these say what the replay did (so a reader can see the
stream is not trivial) and check from first principles that a cached prefix is only ever shared
between requests with the same `cache_salt`. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from lpc.difftest.ops import (
    COMPARED_FIELDS,
    NewRequest,
    StepRecord,
    Stream,
    first_difference,
)


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first step at which two replays of one stream disagree."""

    stream: str
    step: int
    operation: str
    field: str
    ours: object
    theirs: object
    previous_free_queue: tuple[int, ...] | None

    def message(self, theirs_name: str = "vLLM") -> str:
        before = (
            ""
            if self.previous_free_queue is None
            else f"; free queue before the step (both agreed): {list(self.previous_free_queue)}"
        )
        where = ""
        if isinstance(self.ours, tuple) and isinstance(self.theirs, tuple):
            pairs = enumerate(zip(self.ours, self.theirs, strict=False))
            i = next((i for i, (a, b) in pairs if a != b), min(len(self.ours), len(self.theirs)))
            where = f" (they part at position {i})"
        return (
            f"{self.stream}, step {self.step} ({self.operation}): first differing field "
            f"{self.field!r}{where}: ours={self.ours!r} {theirs_name}={self.theirs!r}{before}"
        )


def first_divergence(
    stream: Stream,
    ours: Sequence[StepRecord],
    theirs: Sequence[StepRecord],
    fields: Sequence[str] = COMPARED_FIELDS,
) -> Divergence | None:
    """Compare two replays of `stream` record by record (the config record is step 0)."""
    name = stream.config.name
    previous: tuple[int, ...] | None = None
    operations = ["config", *(describe_op(op) for op in stream.ops)]
    for step, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a.step != step or b.step != step:
            return Divergence(name, step, operations[step], "step", a.step, b.step, previous)
        field = first_difference(a, b, fields)
        if field is not None:
            return Divergence(
                name,
                step,
                operations[step],
                field,
                getattr(a, field),
                getattr(b, field),
                previous,
            )
        previous = a.free_queue
    if len(ours) != len(theirs) or len(ours) != len(operations):
        step = min(len(ours), len(theirs))
        return Divergence(
            name,
            step,
            operations[step] if step < len(operations) else "end of stream",
            "number of records",
            len(ours),
            len(theirs),
            previous,
        )
    return None


@dataclass(slots=True)
class ReplayTotals:
    """Counts over the records of one or more replays."""

    requests: int = 0
    failures: int = 0
    hit_requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    evictions: int = 0
    frees: int = 0

    @property
    def token_hit_ratio(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def add(self, other: ReplayTotals) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def summary(self) -> str:
        return (
            f"{self.requests} requests, {self.hit_requests} with hits, "
            f"{self.hit_tokens} hit tokens of {self.prompt_tokens} prompt tokens "
            f"({self.token_hit_ratio:.1%}), {self.evictions} evictions, "
            f"{self.failures} allocation failures, {self.frees} frees"
        )


def replay_totals(stream: Stream, records: Sequence[StepRecord]) -> ReplayTotals:
    """Totals of one replay: hits and prompt tokens count successful allocations only."""
    totals = ReplayTotals()
    for op, record in zip(stream.ops, records[1:], strict=True):
        if isinstance(op, NewRequest):
            totals.requests += 1
            if record.block_ids is None:
                totals.failures += 1
                continue
            totals.prompt_tokens += len(op.prompt)
            totals.hit_tokens += record.hit_tokens or 0
            totals.hit_requests += bool(record.hit_tokens)
            totals.evictions += len(record.evicted)
        else:
            totals.frees += bool(record.held)
    return totals


@dataclass(frozen=True, slots=True)
class SaltReport:
    """How salt isolation fared in one replay."""

    violations: tuple[str, ...]
    # Requests for which another salt (or no salt) had allocated a longer block-aligned prefix of
    # the prompt than the request's own salt ever had: the cases where isolation had something
    # to refuse, whatever was evicted since.
    cross_salt_opportunities: int
    salted_hits: int


def check_salt_isolation(stream: Stream, records: Sequence[StepRecord]) -> SaltReport:
    """Every hit must be a block-aligned prefix some earlier allocation held under the same salt.

    Keeps the set of (salt, full-block prefix) of every successfully allocated sequence (a
    superset of what can still be cached, since eviction is ignored), so a hit outside it is a
    leak between salts or a hit on content that was never cached.
    """
    bs = stream.config.block_size
    seen: set[tuple[str | None, tuple[int, ...]]] = set()
    salts: set[str | None] = set()
    violations: list[str] = []
    opportunities = 0
    salted_hits = 0
    for op, record in zip(stream.ops, records[1:], strict=True):
        if not isinstance(op, NewRequest):
            continue
        hit = record.hit_tokens or 0
        if hit % bs or hit >= max(len(op.prompt), 1):
            violations.append(
                f"step {record.step}: hit of {hit} tokens is not whole blocks "
                f"below the prompt's {len(op.prompt)} tokens"
            )
        if hit and (op.cache_salt, op.prompt[:hit]) not in seen:
            violations.append(
                f"step {record.step}: request {op.request_id} (salt "
                f"{op.cache_salt!r}) hit {hit} tokens never cached under its salt"
            )
        salted_hits += bool(hit and op.cache_salt)
        opportunities += _longest_elsewhere(op, seen, salts, bs) > _longest(op, seen, bs)
        if record.block_ids is None:
            continue
        sequence = op.prompt + op.output
        salts.add(op.cache_salt)
        for end in range(bs, len(sequence) + 1, bs):
            seen.add((op.cache_salt, sequence[:end]))
    return SaltReport(tuple(violations), opportunities, salted_hits)


def _boundaries(op: NewRequest, bs: int) -> range:
    """Hit lengths a lookup may return, longest first (capped at the prompt minus one token)."""
    return range((len(op.prompt) - 1) // bs * bs, 0, -bs)


def _longest(op: NewRequest, seen: set[tuple[str | None, tuple[int, ...]]], bs: int) -> int:
    return next((n for n in _boundaries(op, bs) if (op.cache_salt, op.prompt[:n]) in seen), 0)


def _longest_elsewhere(
    op: NewRequest, seen: set[tuple[str | None, tuple[int, ...]]], salts: set[str | None], bs: int
) -> int:
    others = [s for s in salts if s != op.cache_salt]
    return next(
        (n for n in _boundaries(op, bs) if any((s, op.prompt[:n]) in seen for s in others)), 0
    )


def frees_out_of_order(stream: Stream) -> int:
    """Frees that release a request other than the oldest one still outstanding (not FIFO)."""
    outstanding: list[str] = []
    count = 0
    for op in stream.ops:
        if isinstance(op, NewRequest):
            outstanding.append(op.request_id)
        elif op.request_id in outstanding:
            count += outstanding[0] != op.request_id
            outstanding.remove(op.request_id)
    return count


def describe_op(op: object) -> str:
    """A short description of an operation, for failure messages."""
    if isinstance(op, NewRequest):
        salt = f", salt {op.cache_salt!r}" if op.cache_salt else ""
        return (
            f"new {op.request_id}: {len(op.prompt)} prompt + {len(op.output)} output tokens{salt}"
        )
    return f"free {getattr(op, 'request_id', op)}"
