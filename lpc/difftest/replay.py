"""Replay an operation stream on our block manager and record every step.

The counterpart of `scripts/vllm_replay.py`, which replays the same stream on vLLM's
`KVCacheManager`; both emit `StepRecord`s of the same shape, so a test can compare them step by
step. The time passed to the manager is the step number (LRU ignores it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from eviction import Evictor, LRUEvictor
from lpc.blocks.block_manager import CacheRequest, PrefixCacheBlockManager
from lpc.difftest.ops import FreeRequest, NewRequest, StepRecord, Stream

StepObserver = Callable[[PrefixCacheBlockManager, StepRecord], None]


def replay_stream(
    stream: Stream,
    make_evictor: Callable[[int], Evictor] = LRUEvictor,
    observe: StepObserver | None = None,
) -> Iterator[StepRecord]:
    """Yield the record of the config step (step 0, the initial pool) and of every operation.

    `observe(manager, record)` runs after every step, before the record is yielded (tests use it
    to check invariants or to look at the manager's state).
    """
    config = stream.config
    manager = PrefixCacheBlockManager(
        config.num_blocks, config.block_size, evictor=make_evictor(config.num_blocks)
    )
    record = _record(manager, config.name, 0, "config", None, None, None, (), None)
    if observe is not None:
        observe(manager, record)
    yield record
    for step, op in enumerate(stream.ops, 1):
        if isinstance(op, NewRequest):
            request = CacheRequest(
                op.request_id, op.prompt + op.output, len(op.prompt), cache_salt=op.cache_salt
            )
            prefix = manager.find_computed_prefix(request)
            allocation = manager.allocate(request, prefix, float(step))
            record = _record(
                manager,
                config.name,
                step,
                "new",
                op.request_id,
                prefix.num_tokens,
                None if allocation is None else allocation.block_ids,
                () if allocation is None else allocation.evicted_block_ids,
                None,
            )
        elif isinstance(op, FreeRequest):
            held = op.request_id in manager.active_request_ids()
            if held:
                manager.free(op.request_id, float(step))
            record = _record(
                manager, config.name, step, "free", op.request_id, None, None, (), held
            )
        else:  # pragma: no cover - streams hold only these two operations
            raise TypeError(f"unexpected operation {op!r}")
        if observe is not None:
            observe(manager, record)
        yield record


def _record(
    manager: PrefixCacheBlockManager,
    stream: str,
    step: int,
    op: str,
    request_id: str | None,
    hit_tokens: int | None,
    block_ids: tuple[int, ...] | None,
    evicted: tuple[int, ...],
    held: bool | None,
) -> StepRecord:
    cached = tuple(b for b in range(manager.num_blocks) if manager.block_hash(b) is not None)
    return StepRecord(
        stream=stream,
        step=step,
        op=op,
        request_id=request_id,
        hit_tokens=hit_tokens,
        block_ids=None if block_ids is None else tuple(block_ids),
        evicted=tuple(evicted),
        held=held,
        free_queue=tuple(manager.evictor.free_block_ids()),
        cached=cached,
    )
