"""SGLang's `tlru` radix eviction strategy: T-LRU with L the high-water depth of every chain
through a block.

Source: SGLang 0.5.23, `sglang/srt/mem_cache/evict_policy.py` (`--radix-eviction-policy
tlru`, merged in #34012), `TLRUStrategy.get_priority`:

    budget = max(
        node._tlru_history_len + self.next_prompt_estimate - self.threshold, 0
    )
    cached_without_this_node = node._tlru_cached_prefix_len - len(node.key)
    tel_safe = cached_without_this_node >= budget
    return (-1 if tel_safe else 0, node.last_access_time)

with, from its comment: "node._tlru_history_len is the branch's high-water depth, i.e. the
paper's L, and deliberately does not shrink when the tail is trimmed. Deriving L from what is
still resident instead would leave the shortened conversation over budget on the next pass
too, and T-LRU would walk it down to nothing rather than stopping after (threshold - Q_hat)
tokens." `unified_tree_core._set_tlru_lens_and_raise_history` raises the history of a new
node and of every ancestor to the new node's prefix length; the defaults are threshold =
next_prompt_estimate = 0 (then nothing is TEL-safe: LRU).

In block terms (`eviction/tlru.py` has the paper's statement and the queues): a block's L is
the longest chain that any request released through it (freed or still shared) since the
block's content was cached; it never shrinks while the content stays, and starts over when
the block is evicted or its content dropped. SGLang counts tokens (multiply the paper's blocks
by the page size); here, as in the paper, ξ and Q̂ are blocks. SGLang's radix tree evicts only
leaves; here a request's blocks are released tail first, so a chain's deeper blocks leave
before its shallower ones within each phase.
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
