"""What the serving engines need of the return-window evictor (`lpc-return`): protected
pushes for a preempted request's blocks, batched pushes equal to single pushes (vLLM's CPU
tier), a score that stays a probability whatever a curve answers, and LRU mode's evictions
counting towards W."""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from eviction import FreedBlocks, Release
from eviction.return_window import PROTECTED_SCORE, ReturnWindowEvictor
from predictor.return_curve import ReturnCurve

NUM_BLOCKS = 10
CONVERSATIONS = ["a", "b", "c", None]


def curve(return_s: float, share: float = 1.0) -> ReturnCurve:
    """`share` of the conversation comes back `return_s` after the release, the rest never."""
    return ReturnCurve(
        np.array([0.0, return_s * (1 - 1e-9), return_s]), np.array([1.0, 1.0, 1.0 - share])
    )


CURVES = [None, curve(1.0), curve(5.0, 0.5), curve(40.0, 0.9)]


def new_evictor(num_blocks: int = NUM_BLOCKS, **options: Any) -> ReturnWindowEvictor:
    evictor = ReturnWindowEvictor(num_blocks, **options)
    evictor.reset([])
    return evictor


def claims_of(evictor: ReturnWindowEvictor, block_id: int) -> list[tuple] | None:
    slot = evictor._state[block_id]
    if slot is None:
        return None
    return [
        (c.conversation_id, id(c.curve), c.release_s, c.protected_score)
        for c in slot.tag  # type: ignore[union-attr]
    ]


def state_of(evictor: ReturnWindowEvictor, now_s: float) -> dict[str, Any]:
    return {
        # the real pop order, of a copy (a pickle round trip: copy.deepcopy, ~5x slower)
        "order": pickle.loads(pickle.dumps(evictor, pickle.HIGHEST_PROTOCOL)).pop_n(
            len(evictor), now_s
        ),
        "claims": [claims_of(evictor, b) for b in range(NUM_BLOCKS)],
        "window_s": evictor.window_s,
        "rekeys": evictor.rekeys,
        "released_at": [t if not math.isnan(t) else None for t in evictor._released_at],
    }


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_batched_push_is_the_single_pushes(data: st.DataObject) -> None:
    """Random pushes (cached and protected, any depths, pooled across conversations), hits
    and pops with the clock moving (so W is re-measured and every run re-keyed): the batched
    evictor hands out the blocks the single-push one does and keeps the same claims."""
    batched, single = new_evictor(rekey_interval_s=2.0), new_evictor(rekey_interval_s=2.0)
    now = 0.0
    for _ in range(data.draw(st.integers(1, 25), label="steps")):
        queued = [b for b in range(NUM_BLOCKS) if b in batched]
        idle = [b for b in range(NUM_BLOCKS) if b not in batched]
        action = data.draw(st.sampled_from(["push", "push", "push", "hit", "pop"]))
        now += data.draw(st.sampled_from([0.0, 0.5, 1.5, 3.0]))
        if action == "push" and idle:
            blocks = data.draw(st.lists(st.sampled_from(idle), min_size=1, unique=True))
            depths = data.draw(
                st.lists(st.integers(0, 3), min_size=len(blocks), max_size=len(blocks))
            )
            release = Release(
                now,
                None,
                data.draw(st.sampled_from(CONVERSATIONS)),
                return_curve=data.draw(st.sampled_from(CURVES)),
            )
            kind = data.draw(st.sampled_from(["cached", "protected"]))
            getattr(batched, f"push_{kind}_each")(
                FreedBlocks(blocks, depths, [None] * len(blocks)), release
            )
            for block, depth in zip(blocks, depths, strict=True):
                getattr(single, f"push_{kind}")(FreedBlocks([block], [depth], [None]), release)
        elif action == "hit" and queued:
            block = data.draw(st.sampled_from(queued))
            batched.remove(block)
            single.remove(block)
        elif action == "pop" and queued:
            n = data.draw(st.integers(1, len(queued)))
            assert batched.pop_n(n, now) == single.pop_n(n, now)
        batched.check_invariants()
        assert state_of(batched, now) == state_of(single, now)


def test_a_preempted_requests_blocks_go_after_every_queued_block_until_taken_back() -> None:
    evictor = ReturnWindowEvictor(12, rekey_interval_s=0.0, initial_window_s=30.0)
    evictor.reset(range(12))
    blocks = evictor.pop_n(12, 0.0)
    sure, preempted, later, never = blocks[:3], blocks[3:5], blocks[5:7], blocks[7:9]
    # A conversation certain to come back within W, then a preemption, then releases after it.
    evictor.push_cached(
        FreedBlocks(sure, [2, 1, 0], [None] * 3), Release(1.0, None, "A", None, curve(2.0))
    )
    evictor.push_protected(
        FreedBlocks(preempted, [1, 0], [None] * 2), Release(2.0, None, "P", None, curve(1e6))
    )
    evictor.push_cached(
        FreedBlocks(later, [1, 0], [None] * 2), Release(3.0, None, "B", None, curve(2.0))
    )
    evictor.push_cached(FreedBlocks(never, [1, 0], [None] * 2), Release(4.0, None, "C"))
    evictor.check_invariants()
    # Re-keyed at every pop: the protected claim keeps its place, whatever time has passed.
    order = evictor.pop_n(9, 500.0)
    assert order[-2:] == preempted
    assert set(order[:-2]) == set(sure + later + never)
    # A second protection goes after the first.
    evictor.push_protected(FreedBlocks(later, [1, 0], [None] * 2), Release(600.0, None, "Q"))
    evictor.push_protected(FreedBlocks(never, [1, 0], [None] * 2), Release(601.0, None, "R"))
    evictor.push_cached(
        FreedBlocks(sure, [2, 1, 0], [None] * 3), Release(602.0, None, "A", None, curve(2.0))
    )
    assert evictor.pop_n(7, 603.0) == sure + later + never


def test_the_request_taking_its_blocks_back_replaces_the_protected_claim() -> None:
    evictor = ReturnWindowEvictor(6, rekey_interval_s=0.0, initial_window_s=30.0)
    evictor.reset(range(6))
    blocks = evictor.pop_n(6, 0.0)
    evictor.push_protected(FreedBlocks(blocks[:2], [1, 0], [None] * 2), Release(1.0, None, "P"))
    assert evictor.score(evictor._state[blocks[0]].tag, 1.0) == PROTECTED_SCORE + 1.0
    evictor.remove(blocks[0])  # rescheduled: a hit takes it back
    evictor.remove(blocks[1])
    # It finishes: its release replaces its own protected claim (one conversation, one claim).
    evictor.push_cached(
        FreedBlocks(blocks[:2], [1, 0], [None] * 2), Release(5.0, None, "P", None, curve(1e6))
    )
    assert [c.protected_score for c in evictor._state[blocks[0]].tag] == [None]
    evictor.push_cached(
        FreedBlocks(blocks[2:4], [1, 0], [None] * 2), Release(6.0, None, "A", None, curve(2.0))
    )
    assert evictor.pop_n(4, 7.0) == blocks[:4]  # P never comes back within W; A does


def test_a_protected_release_of_blocks_others_hold_is_remembered() -> None:
    evictor = ReturnWindowEvictor(6, rekey_interval_s=0.0, initial_window_s=30.0)
    evictor.reset(range(6))
    blocks = evictor.pop_n(6, 0.0)
    shared = FreedBlocks(blocks[:1], [0], [None])
    evictor.note_protected_release(shared, Release(1.0, None, "P"))
    # The other holder releases it later; the preempted request still needs it.
    evictor.push_cached(shared, Release(2.0, None, "B", None, curve(1e6)))
    evictor.push_cached(
        FreedBlocks(blocks[1:3], [1, 0], [None] * 2), Release(3.0, None, "A", None, curve(2.0))
    )
    assert {c.conversation_id for c in evictor._state[blocks[0]].tag} == {"P", "B"}
    assert evictor.pop_n(3, 4.0) == [blocks[1], blocks[2], blocks[0]]
    evictor.check_invariants()


class Answers:
    """A curve-like object answering `value` whatever it is asked."""

    def __init__(self, value: float) -> None:
        self.value = value

    def p_return_within(self, silent_s: float, window_s: float) -> float:
        return self.value


def test_a_curve_answering_no_probability_scores_the_fallback() -> None:
    evictor = ReturnWindowEvictor(8, rekey_interval_s=0.0, fallback_score=0.25)
    evictor.reset(range(8))
    blocks = evictor.pop_n(8, 0.0)
    for i, value in enumerate([math.nan, 1.5, -0.1, math.inf]):
        release = Release(1.0, None, f"c{i}", None, Answers(value))
        evictor.push_cached(FreedBlocks(blocks[2 * i : 2 * i + 2], [1, 0], [None] * 2), release)
        assert evictor.score(evictor._state[blocks[2 * i]].tag, 1.0) == 0.25
    evictor.pop_n(3, 10.0)  # re-keyed: still the fallback, and the heap stays in order
    evictor.check_invariants()
    assert all(run[0][0] == 0.25 for run in evictor._heap)


def test_blocks_another_order_hands_out_count_towards_the_turnover() -> None:
    evictor = ReturnWindowEvictor(8, rekey_interval_s=1.0, initial_window_s=100.0)
    evictor.reset(range(8))
    blocks = evictor.pop_n(8, 0.0)
    evictor.push_cached(FreedBlocks(blocks[:6], [5, 4, 3, 2, 1, 0], [None] * 6), Release(1.0))
    evictor.push_uncached(blocks[6:])
    evictor.rekey(2.0)
    evictor.discard_n([blocks[6], blocks[0], blocks[1]])  # one uncached, two cached
    assert evictor._evicted_since_rekey == 2
    evictor.rekey(12.0)  # 4 queued, 10 s, 2 evicted: a turnover of 20 s
    assert evictor.window.value_s == 100.0 + evictor.window.weight * (20.0 - 100.0)
    evictor.check_invariants()
