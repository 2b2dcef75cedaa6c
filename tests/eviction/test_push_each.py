"""`push_cached_each` / `push_protected_each` (LPC and pooled LPC) against one single-block
push per block in the same order: on random interleavings of pushes, hits, forgets and pops,
both evictors must hand out the same blocks and keep the same state (keys, pooling memory,
counters). vLLM's CPU tier (`lpc.integrations.vllm_cache_policy`) relies on it to batch the
chunks vLLM makes evictable one call at a time."""

from __future__ import annotations

import pickle
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from eviction import FreedBlocks, Release, make_evictor

NUM_BLOCKS = 10
CONVERSATIONS = ["a", "b", "c", None]


def evictor_pair(name: str) -> tuple[Any, Any]:
    # A small memory (5 contents), horizon and gate, so that bounding, judging and the trust
    # gate all happen within a few pushes.
    options: dict[str, Any] = {}
    if name == "lpc-pooled":
        options = dict(
            horizon_s=2.0, memory_window_s=4.0, memory_blocks_factor=0.5, model_min_labels=2
        )
    pair = []
    for _ in range(2):
        evictor = make_evictor(name, NUM_BLOCKS, **options)
        evictor.reset([])
        pair.append(evictor)
    return pair[0], pair[1]


def state_of(evictor: Any) -> dict[str, Any]:
    state = {
        # the real pop order, of a copy (a pickle round trip: copy.deepcopy, ~5x slower)
        "order": pickle.loads(pickle.dumps(evictor, pickle.HIGHEST_PROTOCOL)).pop_n(len(evictor)),
        "keys": [evictor.pooled_key(b) for b in range(NUM_BLOCKS)],
        "tags": [getattr(evictor._state[b], "tag", None) for b in range(NUM_BLOCKS)],
        "top_logit": evictor.top_logit,
        "fallbacks_used": evictor.fallbacks_used,
    }
    if hasattr(evictor, "_memory"):
        state.update(
            memory=list(evictor._memory.items()),
            pending=list(evictor._pending),
            shared=(evictor.shared_releases_judged, evictor.shared_releases_reused),
            model=(evictor.model_labels_judged, evictor.model_loss_nats, evictor.model_trusted),
        )
    return state


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["lpc", "lpc-pooled"]), data=st.data())
def test_a_batched_push_is_the_single_pushes(name: str, data: st.DataObject) -> None:
    batched, single = evictor_pair(name)
    now = 0.0
    for _ in range(data.draw(st.integers(1, 25), label="steps")):
        queued = [b for b in range(NUM_BLOCKS) if b in batched]
        idle = [b for b in range(NUM_BLOCKS) if b not in batched]
        action = data.draw(st.sampled_from(["push", "push", "push", "hit", "forget", "pop"]))
        if action == "push" and idle:
            blocks = data.draw(st.lists(st.sampled_from(idle), min_size=1, unique=True))
            depths = data.draw(
                st.lists(st.integers(0, 3), min_size=len(blocks), max_size=len(blocks))
            )
            hashes = [f"h{b % 7}" if data.draw(st.booleans()) else None for b in blocks]
            now += data.draw(st.sampled_from([0.0, 0.5, 1.5, 3.0]))
            p = data.draw(st.one_of(st.none(), st.floats(0.0, 1.0)))
            release = Release(now, p, data.draw(st.sampled_from(CONVERSATIONS)))
            kind = data.draw(st.sampled_from(["cached", "protected"]))
            getattr(batched, f"push_{kind}_each")(FreedBlocks(blocks, depths, hashes), release)
            for block, depth, content in zip(blocks, depths, hashes, strict=True):
                getattr(single, f"push_{kind}")(FreedBlocks([block], [depth], [content]), release)
        elif action == "hit" and queued:
            block = data.draw(st.sampled_from(queued))
            batched.remove(block)
            single.remove(block)
        elif action == "forget" and idle:
            block = data.draw(st.sampled_from(idle))
            batched.forget(block)
            single.forget(block)
        elif action == "pop" and queued:
            n = data.draw(st.integers(1, len(queued)))
            assert batched.pop_n(n) == single.pop_n(n)
        batched.check_invariants()
        assert state_of(batched) == state_of(single)
