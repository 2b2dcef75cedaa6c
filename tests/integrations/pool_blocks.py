"""The duck-typed blocks and pool the LPC queue's tests build it on, without vLLM: the
fields of vLLM 0.33's `KVCacheBlock` and `BlockPool` that the queue and the list read."""

from __future__ import annotations

from typing import Any


class Pool:
    """What the queue sees of vLLM's `BlockPool`: the attribute that holds its free queue."""

    free_block_queue: Any = None


class Block:
    """vLLM's `KVCacheBlock` fields the queue and the list read (`ref_cnt`, `pool`: the
    pool's)."""

    __slots__ = (
        "block_hash",
        "block_hash_num_tokens",
        "block_id",
        "next_free_block",
        "pool",
        "prev_free_block",
        "ref_cnt",
    )

    def __init__(self, block_id: int, pool: Pool) -> None:
        self.block_id = block_id
        self.pool = pool
        self.block_hash: bytes | None = None
        self.block_hash_num_tokens: int | None = None
        self.prev_free_block: Block | None = None
        self.next_free_block: Block | None = None
        self.ref_cnt = 0


def allocate(queue: Any, n: int, step: int) -> list[Block]:
    """Pop `n` blocks as vLLM's pool allocates them (`popleft` for one, `popleft_n` for more)
    and mark them in use: a reference each, the hash reset. A block handed out twice fails."""
    popped = queue.popleft_n(n) if n > 1 else [queue.popleft()]
    for block in popped:
        assert block.ref_cnt == 0, f"step {step}: block {block.block_id} handed out twice"
        block.ref_cnt = 1
        block.block_hash = block.block_hash_num_tokens = None
    return popped
