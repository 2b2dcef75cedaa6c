"""What the plugin learns about its engine when vLLM builds the first LPC queue: the hash block
size of `Request.block_hashes` and the data-parallel rank of this engine core.

Read once, off the hot path, from the pool the queue's blocks know and the `VllmConfig` the
plugin's scheduler hook saw last. Where each comes from in vLLM 0.33: docs/design.md,
"Engine checks and engine context".
"""

from __future__ import annotations

import multiprocessing
import re
from dataclasses import dataclass
from typing import Any

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


def engine_context(pool: Any = None, vllm_config: Any = None) -> EngineContext:
    """What the block pool building the queue (its `hash_block_size`) and the scheduler's
    config say, with the fallbacks of docs/design.md, "Engine checks and engine context"."""
    size = getattr(pool, "hash_block_size", None)
    block_size = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
    rank = rank_of_config(vllm_config)
    if rank is not None:
        return EngineContext(block_size, rank, "config")
    rank = rank_of_process_name(multiprocessing.current_process().name)
    if rank is not None:
        return EngineContext(block_size, rank, "process name")
    return EngineContext(block_size)
