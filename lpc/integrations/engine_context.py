"""What the plugin learns about its engine when vLLM builds the first LPC queue: the hash block
size of `Request.block_hashes` and the data-parallel rank of this engine core.

vLLM builds the free-block queue as `FreeKVCacheBlockQueue(blocks)`, inside
`BlockPool.__init__` (which holds `hash_block_size`), inside the `Scheduler.__init__` of the
engine core (which holds the `VllmConfig`). Neither is passed to the queue, so the plugin reads
them, once, from those constructors' frames on the call stack; nothing on the hot path.

The data-parallel rank (vLLM 0.33): every engine core process of a data-parallel deployment
runs its own scheduler, block pool and so its own plugin. vLLM sets
`parallel_config.data_parallel_index` to the engine's DP rank in `run_engine_core` (and in the
Ray actor) for every model; `data_parallel_rank` itself is reset to 0 for dense models, whose
ranks run independently (`reconfigure_for_independent_dp_rank`). So the rank is, in order:
`data_parallel_index` of the scheduler's config, else its `data_parallel_rank`, else the
`_DP<rank>` suffix vLLM gives the engine core's process name (`EngineCore_DP3`,
`DPEngineCoreActor_DP3`), else 0 (no data parallelism).
"""

from __future__ import annotations

import multiprocessing
import re
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any

MAX_FRAMES = 40  # how far up the stack the constructors are looked for
_DP_SUFFIX = re.compile(r"_DP(\d+)$")


@dataclass(frozen=True)
class EngineContext:
    """The engine facts the plugin needs (defaults: unknown block size, rank 0)."""

    hash_block_size: int | None = None
    data_parallel_rank: int = 0
    rank_source: str = "default"  # config, process name or default


def rank_of_config(vllm_config: Any) -> int | None:
    """The DP rank a `VllmConfig` gives this engine core (None: not a config)."""
    parallel = getattr(vllm_config, "parallel_config", None)
    for name in ("data_parallel_index", "data_parallel_rank"):
        value = getattr(parallel, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def rank_of_process_name(name: str) -> int | None:
    """The DP rank in vLLM's engine-core process name (`EngineCore_DP3` -> 3), or None."""
    match = _DP_SUFFIX.search(name)
    return int(match.group(1)) if match else None


def engine_context(frame: FrameType | None = None) -> EngineContext:
    """Walk up from `frame` (default: the caller's) to the block pool and the scheduler that
    are building the queue; what they say, with the fallbacks of the module docstring."""
    frame = frame if frame is not None else sys._getframe(1)
    block_size: int | None = None
    rank: int | None = None
    for _ in range(MAX_FRAMES):
        if frame is None or (block_size is not None and rank is not None):
            break
        owner = frame.f_locals.get("self")
        if owner is not None:
            size = getattr(owner, "hash_block_size", None)
            if block_size is None and isinstance(size, int) and size > 0:
                block_size = size
            if rank is None:
                rank = rank_of_config(getattr(owner, "vllm_config", None))
        frame = frame.f_back
    if rank is not None:
        return EngineContext(block_size, rank, "config")
    rank = rank_of_process_name(multiprocessing.current_process().name)
    if rank is not None:
        return EngineContext(block_size, rank, "process name")
    return EngineContext(block_size)
