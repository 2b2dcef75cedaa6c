"""vLLM 0.33's `FreeKVCacheBlockQueue`, transcribed, for where vLLM is not installed.

The LPC queue's off mode *is* vLLM's own free queue (`vllm_queue.bind_queue_class` takes the
engine's class). Without vLLM (the default test suite, replays) it takes this transcription:
the same doubly linked list through the blocks' `prev_free_block` / `next_free_block`, with a
fake head and tail, the same methods and the same errors. The engine tests check it against
vLLM's class operation by operation (tests/integrations/test_kill_switch_vllm.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class _End:
    """The fake head or tail of the list: never handed out."""

    __slots__ = ("block_id", "next_free_block", "prev_free_block")

    def __init__(self) -> None:
        self.block_id = -1
        self.prev_free_block: Any = None
        self.next_free_block: Any = None


class StockFreeBlockQueue:
    """Free blocks in LRU order: the front is evicted first; O(1) everywhere, no allocation."""

    def __init__(self, blocks: list[Any]) -> None:
        self.num_free_blocks = len(blocks)
        for i in range(self.num_free_blocks):
            if i > 0:
                blocks[i].prev_free_block = blocks[i - 1]
            if i < self.num_free_blocks - 1:
                blocks[i].next_free_block = blocks[i + 1]
        self.fake_free_list_head = _End()
        self.fake_free_list_tail = _End()
        if self.num_free_blocks > 0:
            self.fake_free_list_head.next_free_block = blocks[0]
            blocks[0].prev_free_block = self.fake_free_list_head
            self.fake_free_list_tail.prev_free_block = blocks[-1]
            blocks[-1].next_free_block = self.fake_free_list_tail
        else:
            self.fake_free_list_head.next_free_block = self.fake_free_list_tail
            self.fake_free_list_tail.prev_free_block = self.fake_free_list_head

    def popleft(self) -> Any:
        head = self.fake_free_list_head
        first_block = head.next_free_block
        if first_block is self.fake_free_list_tail or first_block is None:
            assert self.num_free_blocks == 0, (
                f"num_free_blocks ({self.num_free_blocks}) is out of sync with the free list."
            )
            raise ValueError("No free blocks available")
        next_block = first_block.next_free_block
        if next_block is None:
            raise RuntimeError(
                "Invalid block found in popleft() which doesn't have a valid next_free_block"
            )
        head.next_free_block = next_block
        next_block.prev_free_block = head
        first_block.prev_free_block = first_block.next_free_block = None
        self.num_free_blocks -= 1
        return first_block

    def popleft_n(self, n: int) -> list[Any]:
        if n == 0:
            return []
        assert self.num_free_blocks >= n
        self.num_free_blocks -= n
        curr_block = self.fake_free_list_head.next_free_block
        if n == 1:
            assert curr_block is not None
            next_block = curr_block.next_free_block
            curr_block.prev_free_block = None
            curr_block.next_free_block = None
            if next_block is not None:
                self.fake_free_list_head.next_free_block = next_block
                next_block.prev_free_block = self.fake_free_list_head
            return [curr_block]
        ret = []
        for _ in range(n):
            assert curr_block is not None
            ret.append(curr_block)
            last_block = curr_block
            curr_block = curr_block.next_free_block
            last_block.prev_free_block = None
            last_block.next_free_block = None
        if curr_block is not None:
            self.fake_free_list_head.next_free_block = curr_block
            curr_block.prev_free_block = self.fake_free_list_head
        return ret

    def remove(self, block: Any) -> None:
        prev_block = block.prev_free_block
        next_block = block.next_free_block
        if prev_block is None or next_block is None:
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        prev_block.next_free_block = next_block
        next_block.prev_free_block = prev_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: Any) -> None:
        tail = self.fake_free_list_tail
        last_block = tail.prev_free_block
        if last_block is None:
            raise RuntimeError("prev_free_block of fake_free_list_tail should always exist")
        last_block.next_free_block = block
        block.prev_free_block = last_block
        block.next_free_block = tail
        tail.prev_free_block = block
        self.num_free_blocks += 1

    def prepend_n(self, blocks: list[Any]) -> None:
        if len(blocks) == 0:
            return
        first_block = self.fake_free_list_head.next_free_block
        assert first_block is not None, "next_free_block of fake_free_list_head should always exist"
        prev_block = self.fake_free_list_head
        for block in blocks:
            block.prev_free_block = prev_block
            prev_block.next_free_block = block
            prev_block = block
        prev_block.next_free_block = first_block
        first_block.prev_free_block = prev_block
        self.num_free_blocks += len(blocks)

    def append_n(self, blocks: list[Any]) -> None:
        if not blocks:
            return
        tail = self.fake_free_list_tail
        last_block = tail.prev_free_block
        assert last_block is not None, "prev_free_block of fake_free_list_tail should always exist"
        for block in blocks:
            block.prev_free_block = last_block
            last_block.next_free_block = block
            last_block = block
        last_block.next_free_block = tail
        tail.prev_free_block = last_block
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[Any]:
        ret = []
        if self.fake_free_list_head.next_free_block is None:
            raise RuntimeError("next_free_block of fake_free_list_head should always exist")
        curr_block = self.fake_free_list_head.next_free_block
        while curr_block.next_free_block is not None:
            ret.append(curr_block)
            curr_block = curr_block.next_free_block
        return ret

    def iter_blocks_after(self, cursor: Any | None) -> Iterator[Any]:
        if cursor is None:
            curr_block = self.fake_free_list_head.next_free_block
        else:
            curr_block = cursor.next_free_block
        while curr_block is not None and curr_block is not self.fake_free_list_tail:
            yield curr_block
            curr_block = curr_block.next_free_block
