"""The example of vLLM's "Automatic Prefix Caching" doc, step by step, as vLLM 0.33.0 runs it.

The doc (shared/seeds/vllm-automatic-prefix-caching.en.txt) uses block size 4 and 10 blocks:
request 0 (15 prompt tokens, decoding fills its 4th block and takes a 5th), request 1 (14
prompt tokens, the first 10 shared with request 0), request 0 freed, request 1 freed, then
request 2 (29 prompt tokens, the first 12 shared). The expectations below are NOT the doc's
text: they are what vLLM 0.33.0 really does, checked against it. `lpc.difftest.docs_example`
holds the same operations as a stream; `test_replayed_stream_matches_the_table` ties this
table to that stream, and tests/vllm/test_differential.py::test_docs_example_matches_vllm
replays the stream on vLLM's own KVCacheManager and requires every step to agree (block
tables, hits, evictions, free-queue order, cached blocks). Where and why we differ from the doc:

1. The null block. vLLM 0.33.0's BlockPool takes block 0 as a placeholder "null block" when it
   starts, so 10 usable blocks need 11, and every block id here is the doc's plus one (the
   doc's block k is our block k+1).
2. One-shot allocation. The doc allocates request 0's prompt at Time 1 and a 5th block when
   decoding fills its 4th at Time 2; our API allocates prompt and output at once, so request 0
   holds its final 17 tokens (15 prompt + 2 output) from step 1: blocks 1-5, 1-4 cached.
3. Blocks without a hash go to the FRONT of the free queue. The doc appends every freed block
   at the tail. vLLM 0.33.0's `free_blocks` prepends the blocks that hold no hash (partial last
   blocks) so they are reused first, and appends only cached blocks, tail first. At Time 4 the
   doc's queue is 7-8-9-4-3-2 (8-9-10-5-4-3 in our ids); ours is 5-8-9-10-4-3: request 0's
   last block 5 (the doc's 4) holds one token and goes first; blocks 1 and 2 are still held by
   request 1. At Time 5 the doc's queue is 7-8-9-4-3-2-6-5-1-0 (8-9-10-5-4-3-7-6-2-1 in our
   ids); ours is 7-5-8-9-10-4-3-6-2-1: request 1's partial block 7 (the doc's 6, tokens 12-13)
   is prepended ahead of 5, while its cached blocks 6, 2, 1 join the tail in that order.
4. No eviction at request 2. The doc's Time 6 touches the hits 0-1-2 (our 1-2-3), leaving
   7-8-9-4-3-6-5, then allocates 7, 8, 9, 4, 3 and evicts its cached block 3. In vLLM 0.33.0
   the queue after the touch is 7-5-8-9-10-4-6 and the five new blocks are 7, 5, 8, 9, 10: the
   two partial, unhashed blocks and three never-used ones, so nothing is evicted and the doc's
   victim (our block 4, request 0's tokens 12-15) stays cached.
5. The doc's eviction happens one request later. A request 3, not in the doc, needs two blocks
   and evicts 4 then 6 in LRU order: request 0's chain tail, then request 1's third block. With
   request 2 four tokens longer (33) vLLM evicts block 4 at request 2 itself, as the doc does,
   and request 3 then finds one free block for two and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from eviction import LRUEvictor
from lpc.blocks.block_manager import CacheRequest, PrefixCacheBlockManager
from lpc.difftest.docs_example import (
    BLOCK_SIZE,
    NUM_BLOCKS,
    REQUEST_0_OUTPUT,
    REQUEST_0_PROMPT,
    REQUEST_1_PROMPT,
    REQUEST_3_PROMPT,
    docs_example_stream,
    request_2_prompt,
)
from lpc.difftest.ops import NewRequest
from lpc.difftest.replay import replay_stream


@dataclass(frozen=True)
class Expected:
    """One step of the example: what the manager reports and its state afterwards."""

    what: str
    hit_tokens: int | None  # None for a free
    block_ids: tuple[int, ...] | None  # None for a free or a failed allocation
    evicted: tuple[int, ...]
    free_queue: tuple[int, ...]
    cached: tuple[int, ...]


START = Expected(
    "empty pool: block 0 is the null block", None, None, (), (1, 2, 3, 4, 5, 6, 7, 8, 9, 10), ()
)
COMMON = (
    Expected(
        "Times 1-2: request 0, 15 prompt + 2 output tokens: 4 full blocks cached",
        0,
        (1, 2, 3, 4, 5),
        (),
        (6, 7, 8, 9, 10),
        (1, 2, 3, 4),
    ),
    Expected(
        "Time 3: request 1 hits 2 blocks (its 3rd matches only 2 of 4 tokens)",
        8,
        (1, 2, 6, 7),
        (),
        (8, 9, 10),
        (1, 2, 3, 4, 6),
    ),
    Expected(
        "Time 4: free request 0: unhashed 5 to the front, cached 4, 3 to the tail",
        None,
        None,
        (),
        (5, 8, 9, 10, 4, 3),
        (1, 2, 3, 4, 6),
    ),
    Expected(
        "Time 5: free request 1: unhashed 7 to the front, cached 6, 2, 1 to the tail",
        None,
        None,
        (),
        (7, 5, 8, 9, 10, 4, 3, 6, 2, 1),
        (1, 2, 3, 4, 6),
    ),
)
WITH_29_TOKENS = (
    *COMMON,
    Expected(
        "Time 6: request 2 (29 tokens) hits 1-3, takes 7 5 8 9 10: no eviction",
        12,
        (1, 2, 3, 7, 5, 8, 9, 10),
        (),
        (4, 6),
        (1, 2, 3, 4, 5, 6, 7, 8, 9),
    ),
    Expected(
        "Time 7: request 3 (5 tokens) evicts 4 then 6, least recently used first",
        0,
        (4, 6),
        (4, 6),
        (),
        (1, 2, 3, 4, 5, 7, 8, 9),
    ),
)
WITH_33_TOKENS = (
    *COMMON,
    Expected(
        "Time 6: request 2 (33 tokens) needs one block more and evicts 4, as the doc",
        12,
        (1, 2, 3, 7, 5, 8, 9, 10, 4),
        (4,),
        (6,),
        (1, 2, 3, 5, 6, 7, 8, 9, 10),
    ),
    Expected(
        "Time 7: request 3 needs 2 blocks, 1 is free: refused, nothing changes",
        0,
        None,
        (),
        (6,),
        (1, 2, 3, 5, 6, 7, 8, 9, 10),
    ),
)
CASES = {29: WITH_29_TOKENS, 33: WITH_33_TOKENS}

# (hit tokens, block table, evicted blocks) of one step
Outcome = tuple[int | None, tuple[int, ...] | None, tuple[int, ...]]


class Walk:
    """Drives the manager through the doc's timeline with its three request-level calls."""

    def __init__(self) -> None:
        self.manager = PrefixCacheBlockManager(NUM_BLOCKS, BLOCK_SIZE, LRUEvictor(NUM_BLOCKS))
        self.time = 0.0

    def new(self, rid: str, prompt: tuple[int, ...], output: tuple[int, ...] = ()) -> Outcome:
        self.time += 1.0
        request = CacheRequest(rid, prompt + output, len(prompt))
        prefix = self.manager.find_computed_prefix(request)
        allocation = self.manager.allocate(request, prefix, self.time)
        if allocation is None:
            return prefix.num_tokens, None, ()
        assert allocation.num_hit_tokens == prefix.num_tokens
        return prefix.num_tokens, allocation.block_ids, allocation.evicted_block_ids

    def free(self, rid: str) -> Outcome:
        self.time += 1.0
        self.manager.free(rid, self.time)
        return None, None, ()

    def check(self, outcome: Outcome, expected: Expected) -> None:
        assert outcome == (expected.hit_tokens, expected.block_ids, expected.evicted), expected.what
        m = self.manager
        assert tuple(m.evictor.free_block_ids()) == expected.free_queue, expected.what
        cached = tuple(b for b in range(NUM_BLOCKS) if m.block_hash(b) is not None)
        assert cached == expected.cached, expected.what
        m.check_invariants()


@pytest.mark.parametrize("request_2_tokens", sorted(CASES))
def test_docs_example_step_by_step(request_2_tokens: int) -> None:
    expected = iter(CASES[request_2_tokens])
    walk = Walk()
    assert tuple(walk.manager.evictor.free_block_ids()) == START.free_queue
    walk.check(walk.new("0", REQUEST_0_PROMPT, REQUEST_0_OUTPUT), next(expected))
    walk.check(walk.new("1", REQUEST_1_PROMPT), next(expected))
    walk.check(walk.free("0"), next(expected))
    walk.check(walk.free("1"), next(expected))
    walk.check(walk.new("2", request_2_prompt(request_2_tokens)), next(expected))
    walk.check(walk.new("3", REQUEST_3_PROMPT), next(expected))
    assert next(expected, None) is None


def test_docs_example_token_overlaps_are_the_docs() -> None:
    assert len(REQUEST_0_PROMPT) == 15 and len(REQUEST_0_PROMPT + REQUEST_0_OUTPUT) == 17
    assert len(REQUEST_1_PROMPT) == 14 and REQUEST_1_PROMPT[:10] == REQUEST_0_PROMPT[:10]
    assert REQUEST_1_PROMPT[10] != REQUEST_0_PROMPT[10]
    r2 = request_2_prompt(29)
    assert len(r2) == 29 and r2[:12] == REQUEST_0_PROMPT[:12] and r2[12] != REQUEST_0_PROMPT[12]
    assert len(request_2_prompt(33)) == 33 and request_2_prompt(33)[:29] == r2


@pytest.mark.parametrize("request_2_tokens", sorted(CASES))
def test_replayed_stream_matches_the_table(request_2_tokens: int) -> None:
    """The stream the vLLM suite replays on vLLM gives exactly this table on our manager."""
    stream = docs_example_stream(request_2_tokens)
    assert [op.request_id for op in stream.ops] == ["0", "1", "0", "1", "2", "3"]
    assert all(op.cache_salt is None for op in stream.ops if isinstance(op, NewRequest))
    records = list(replay_stream(stream))
    for record, expected in zip(records, (START, *CASES[request_2_tokens]), strict=True):
        assert (record.hit_tokens, record.block_ids, record.evicted) == (
            expected.hit_tokens,
            expected.block_ids,
            expected.evicted,
        ), expected.what
        assert (record.free_queue, record.cached) == (expected.free_queue, expected.cached), (
            expected.what
        )
