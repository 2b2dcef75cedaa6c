"""SGLang's `tlru` radix eviction strategy: T-LRU with L the high-water depth of every chain
through a block.

SGLang 0.5.23, `TLRUStrategy.get_priority`; `eviction/tlru.py` has the paper's statement and
the queues. Here a block's L is the longest chain any request released through it since its
content was cached, and starts over when the content goes.

The source and its reading in blocks: docs/design.md, "T-LRU and SGLang's tlru".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from eviction.tlru import REST, SAFE, TLRUEvictor


class SGLangTLRUEvictor(TLRUEvictor):
    """T-LRU whose L is the block's high-water chain length (SGLang's `tlru`)."""

    name: ClassVar[str] = "sglang-tlru"

    def _place(self, block_ids: Sequence[int]) -> None:
        history, depth, queue = self._history, self._depth, self._queue
        length = self._release_blocks
        extra = self.next_prompt_blocks - self.threshold_blocks
        safe, rest = self._safe, self._rest
        for block_id in block_ids:
            high_water = history[block_id] = max(history[block_id], length)
            if depth[block_id] >= max(high_water + extra, 0):
                safe.append(block_id)
                queue[block_id] = SAFE
            else:
                rest.append(block_id)
                queue[block_id] = REST

    def _note_shared(self, block_ids: Sequence[int]) -> None:
        history, length = self._history, self._release_blocks
        for block_id in block_ids:
            history[block_id] = max(history[block_id], length)
