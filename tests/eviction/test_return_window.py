"""The return-window evictor against its brute-force definition, and its W estimate."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eviction import FreedBlocks, Release, make_evictor
from eviction.return_window import (
    Claim,
    EvictionAgeEstimate,
    ReturnWindowEvictor,
    SharedReuse,
    TurnoverEstimate,
)
from lpc.blocks.block_manager import PrefixCacheBlockManager
from predictor.return_curve import ReturnCurve
from tests.eviction.reference_return import BruteForceReturnWindow
from tests.eviction.test_lpc_reference import hashes_of
from tests.lpc.streams import Allocate, random_stream
from tests.properties import SEEDS, examples, exercised


def step_curve(return_s: float) -> ReturnCurve:
    """Perfect knowledge: the next request comes exactly `return_s` after the release."""
    return ReturnCurve(np.array([0.0, return_s * (1 - 1e-9), return_s]), np.array([1.0, 1.0, 0.0]))


def random_curve(rng: random.Random) -> ReturnCurve | None:
    kind = rng.random()
    if kind < 0.1:
        return None
    if kind < 0.5:
        return step_curve(rng.uniform(0.5, 30.0))
    times = np.concatenate([[0.0], np.geomspace(0.5, 60.0, 6)])
    survival = np.concatenate([[1.0], np.sort([rng.random() for _ in range(6)])[::-1]])
    return ReturnCurve(times, survival)


def replay(manager: PrefixCacheBlockManager, steps, curves: dict[str, ReturnCurve | None]):
    trace = []
    for step in steps:
        if isinstance(step, Allocate):
            prefix = manager.find_computed_prefix(step.request, hashes_of(manager, step.request))
            trace.append(manager.allocate(step.request, prefix, step.now_s))
        elif step.request_id in manager.active_request_ids():
            manager.free(step.request_id, step.now_s, None, return_curve=curves[step.request_id])
    return trace


def curves_for(steps, seed: int) -> dict[str, ReturnCurve | None]:
    rng = random.Random(seed)
    return {s.request.request_id: random_curve(rng) for s in steps if isinstance(s, Allocate)}


@pytest.mark.parametrize(
    ("rule", "pooling", "floor", "ties", "memory"),
    [
        ("turnover", "max", None, "depth", None),
        ("eviction-age", "max", None, "depth", None),
        ("turnover", "or", None, "depth", None),
        ("turnover", "max", 0.5, "depth", None),
        ("turnover", "or", 0.25, "depth", None),
        ("turnover", "max", 0.25, "age", None),
        ("eviction-age", "or", None, "age", None),
        # claim memory: (seconds, memory_blocks_factor); 0.25 × 48 blocks binds the size
        ("turnover", "max", 0.25, "age", (30.0, 8.0)),
        ("turnover", "max", 0.25, "age", (30.0, 0.25)),
        ("eviction-age", "or", 0.5, "depth", (5.0, 8.0)),
        # the floor estimated online
        ("turnover", "max", "online", "age", None),
        ("eviction-age", "or", "online", "depth", (30.0, 8.0)),
    ],
)
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_rekeying_at_every_eviction_matches_the_brute_force_definition(
    seed: int,
    rule: str,
    pooling: str,
    floor: float | str | None,
    ties: str,
    memory: tuple[float, float] | None,
) -> None:
    steps = random_stream(seed, 400)
    curves = curves_for(steps, seed)
    memory_s, factor = (None, 8.0) if memory is None else memory
    fast_evictor = ReturnWindowEvictor(
        48,
        rekey_interval_s=0.0,
        initial_window_s=5.0,
        window_rule=rule,
        pooling=pooling,
        shared_floor=floor,
        ties=ties,
        claim_memory_s=memory_s,
        memory_blocks_factor=factor,
    )
    window = TurnoverEstimate(5.0) if rule == "turnover" else EvictionAgeEstimate(5.0)
    slow_evictor = BruteForceReturnWindow(
        48,
        window=window,
        pooling=pooling,
        shared_floor=floor,
        ties=ties,
        claim_memory_s=memory_s,
        max_entries=fast_evictor.memory_max_entries,
    )
    fast = PrefixCacheBlockManager(48, block_size=4, evictor=fast_evictor)
    slow = PrefixCacheBlockManager(48, block_size=4, evictor=slow_evictor)
    fast_trace = replay(fast, steps, curves)
    slow_trace = replay(slow, steps, curves)
    evictions = sum(len(a.evicted_block_ids) for a in fast_trace if a is not None)
    assert evictions > 20, "the stream must put the pool under pressure"
    for i, (a, b) in enumerate(zip(fast_trace, slow_trace, strict=True)):
        assert a == b, f"seed {seed}, allocation {i}: heap {a} != reference {b}"
    assert fast_evictor.window.value_s == pytest.approx(slow_evictor.window.value_s)
    assert fast_evictor.window.observed > 0
    fast_evictor.check_invariants()


class RegretProbe(ReturnWindowEvictor):
    """Records, per eviction call, how far the victims' mean exact score lies above the mean
    of the smallest exact scores among the free cached blocks (0: the exact victims)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.regrets: list[float] = []
        self.at_rekey: list[bool] = []

    def _exact_scores(self, now_s: float) -> dict[int, float]:
        return {b: self.score(self._state[b].tag, now_s) for b in self._ordered()}

    def rekey(self, now_s: float) -> None:
        super().rekey(now_s)
        self._exact = self._exact_scores(now_s)  # with the W this re-keying set

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        self._exact = self._exact_scores(now_s)
        will_rekey = now_s - self._last_rekey_s >= self.rekey_interval_s
        from_uncached = self._uncached.size
        out = super().pop_n(n, now_s)
        exact = self._exact
        victims = out[from_uncached:]
        if victims:
            best = sorted(exact.values())[: len(victims)]
            self.regrets.append((sum(exact[b] for b in victims) - sum(best)) / len(victims))
            self.at_rekey.append(will_rekey)
        return out


@examples(6)
@given(seed=SEEDS)
def test_a_coarse_rekeying_schedule_is_exact_at_each_rekeying_and_close_between(
    seed: int,
) -> None:
    steps = random_stream(seed, 600)
    curves = curves_for(steps, seed)
    probe = RegretProbe(48, rekey_interval_s=20.0, initial_window_s=5.0)
    replay(PrefixCacheBlockManager(48, block_size=4, evictor=probe), steps, curves)
    regrets = np.asarray(probe.regrets)
    at_rekey = np.asarray(probe.at_rekey)
    # Right after a re-keying the victims are the exact ones.
    assert np.all(np.abs(regrets[at_rekey]) < 1e-12)
    # In between, stale keys may pick worse victims, but not always.
    assert np.all(regrets >= -1e-12)
    exercised("evictions at a re-keying", int(at_rekey.sum()), 0)
    exercised("evictions between re-keyings", int((~at_rekey).sum()), 0)
    assert np.mean(regrets[~at_rekey] > 1e-12) < 0.9


def test_the_window_follows_the_ages_of_evicted_blocks() -> None:
    window = EvictionAgeEstimate(initial_s=60.0, weight=0.5)
    window.observe(100.0)
    assert window.value_s == pytest.approx(80.0)
    window.observe(float("nan"))
    window.observe(-1.0)
    assert window.value_s == pytest.approx(80.0) and window.observed == 1
    for _ in range(50):
        window.observe(10.0)
    assert window.value_s == pytest.approx(10.0)
    with pytest.raises(ValueError):
        EvictionAgeEstimate(weight=0.0)


def test_the_evictor_measures_its_own_eviction_age() -> None:
    evictor = ReturnWindowEvictor(
        8, initial_window_s=1.0, window_weight=1.0, window_rule="eviction-age"
    )
    evictor.reset(range(8))
    blocks = evictor.pop_n(8, 0.0)
    evictor.push_cached(FreedBlocks(blocks[:4], [3, 2, 1, 0], [None] * 4), Release(10.0))
    evictor.push_uncached(blocks[4:])
    assert evictor.window.observed == 0
    evictor.pop_n(5, 50.0)  # four uncached, then one cached block 40 s after its release
    assert evictor.window.value_s == pytest.approx(40.0) and evictor.window.observed == 1


@pytest.mark.parametrize("ties", ["depth", "age"])
def test_the_conversation_that_comes_back_within_w_keeps_its_blocks(ties: str) -> None:
    evictor = make_evictor("lpc-return", 8, rekey_interval_s=0.0, initial_window_s=30.0, ties=ties)
    evictor.reset(range(8))
    blocks = evictor.pop_n(8, 0.0)
    late, soon, never = blocks[:2], blocks[2:4], blocks[4:6]
    evictor.push_cached(
        FreedBlocks(soon, [1, 0], [None] * 2),
        Release(0.0, None, "A", return_curve=step_curve(20.0)),
    )
    evictor.push_cached(
        FreedBlocks(late, [1, 0], [None] * 2),
        Release(0.0, None, "B", return_curve=step_curve(500.0)),
    )
    evictor.push_cached(
        FreedBlocks(never, [1, 0], [None] * 2),
        Release(1.0, None, "C", return_curve=step_curve(0.5)),
    )
    evictor.push_uncached(blocks[6:])
    order = evictor.pop_n(8, 2.0)[2:]
    # Both 0-score conversations go first, then A, which comes back within W; between them,
    # the deeper block first, then the older release, or (`ties="age"`) the older release
    # first, its tail before its head.
    if ties == "depth":
        assert order == [late[0], never[0], late[1], never[1], soon[0], soon[1]]
    else:
        assert order == [late[0], late[1], never[0], never[1], soon[0], soon[1]]
    with pytest.raises(ValueError, match="ties must be one of"):
        ReturnWindowEvictor(8, ties="newest")


def test_max_pooling_keeps_a_block_a_returning_conversation_shares() -> None:
    evictor = ReturnWindowEvictor(8, rekey_interval_s=0.0, initial_window_s=30.0)
    manager = PrefixCacheBlockManager(8, block_size=2, evictor=evictor)
    from lpc.blocks.block_manager import CacheRequest

    a = CacheRequest("a", [1, 2, 3, 4, 5], 4, conversation_id="A")
    b = CacheRequest("b", [1, 2, 7, 8, 9], 4, conversation_id="B")
    table_a = manager.allocate(a, manager.find_computed_prefix(a), 0.0).block_ids
    table_b = manager.allocate(b, manager.find_computed_prefix(b), 0.0).block_ids
    shared = table_a[0]
    manager.free("a", 1.0, None, return_curve=step_curve(10.0))  # A comes back soon
    manager.free("b", 1.0, None, return_curve=step_curve(1000.0))  # B does not, within W
    claims = evictor._state[shared].tag
    assert {c.conversation_id for c in claims} == {"A", "B"}
    assert evictor.score(claims, 2.0) == 1.0
    assert evictor.score(evictor._state[table_b[1]].tag, 2.0) == 0.0


def test_or_pooling_is_the_chance_that_any_claimant_returns() -> None:
    evictor = ReturnWindowEvictor(8, initial_window_s=10.0, window_multiplier=1.0, pooling="or")
    half = ReturnCurve(np.array([0.0, 10.0]), np.array([1.0, 0.5]))  # P(within 10 s) = 0.5
    fifth = ReturnCurve(np.array([0.0, 10.0]), np.array([1.0, 0.8]))
    claims = [Claim("A", half, 0.0), Claim("B", fifth, 0.0)]
    assert evictor.score(claims, 0.0) == pytest.approx(1 - 0.5 * 0.8)
    assert ReturnWindowEvictor(8, initial_window_s=10.0, window_multiplier=1.0).score(
        claims, 0.0
    ) == pytest.approx(0.5)
    protected = [Claim.protected("C", 3.0), Claim("A", half, 0.0)]
    assert evictor.score(protected, 0.0) == Claim.protected("C", 3.0).protected_score
    with pytest.raises(ValueError, match="pooling must be one of"):
        ReturnWindowEvictor(8, pooling="sum")


def test_the_shared_floor_lifts_blocks_two_conversations_claim() -> None:
    evictor = ReturnWindowEvictor(8, initial_window_s=10.0, window_multiplier=1.0, shared_floor=0.5)
    never = step_curve(1000.0)  # P(within W) = 0
    soon = step_curve(5.0)  # P(within W) = 1
    assert evictor.score([Claim("A", never, 0.0), Claim("B", never, 0.0)], 1.0) == 0.5
    assert evictor.score([Claim("A", soon, 0.0), Claim("B", never, 0.0)], 1.0) == 1.0
    assert evictor.score([Claim("A", never, 0.0)], 1.0) == 0.0
    # Anonymous claims never make a block shared.
    assert evictor.score([Claim(None, never, 0.0), Claim("B", never, 0.0)], 1.0) == 0.0
    protected = [Claim.protected("C", 3.0), Claim("A", never, 0.0)]
    assert evictor.score(protected, 1.0) == Claim.protected("C", 3.0).protected_score
    shipped = ReturnWindowEvictor(8, initial_window_s=10.0, window_multiplier=1.0)
    assert shipped.score([Claim("A", never, 0.0), Claim("B", never, 0.0)], 1.0) == 0.25
    unfloored = ReturnWindowEvictor(
        8, initial_window_s=10.0, window_multiplier=1.0, shared_floor=None
    )
    assert unfloored.score([Claim("A", never, 0.0), Claim("B", never, 0.0)], 1.0) == 0.0
    with pytest.raises(ValueError, match="shared_floor"):
        ReturnWindowEvictor(8, shared_floor=1.5)


def test_the_claim_memory_gives_a_recomputed_prefix_its_earlier_claims() -> None:
    never = step_curve(1000.0)  # P(within W) = 0

    def release(evictor: ReturnWindowEvictor, block: int, content: bytes, conv: str, t: float):
        evictor.push_cached(
            FreedBlocks([block], [0], [content]), Release(t, None, conv, None, never)
        )

    def shared_then_evicted(claim_memory_s: float | None) -> ReturnWindowEvictor:
        evictor = ReturnWindowEvictor(
            4, initial_window_s=10.0, window_multiplier=1.0, claim_memory_s=claim_memory_s
        )
        evictor.reset([1, 2, 3])
        release(evictor, 0, b"prefix", "A", 0.0)
        evictor.remove(0)  # B reuses it
        release(evictor, 0, b"prefix", "B", 1.0)
        evictor.pop_n(4, 2.0)  # every block goes, the shared prefix last
        return evictor

    evictor = shared_then_evicted(10.0)
    release(evictor, 1, b"prefix", "C", 3.0)  # the same content, computed again
    claims = evictor._state[1].tag
    assert [c.conversation_id for c in claims] == ["C", "B", "A"][: evictor.max_claims]
    assert evictor.score(claims, 3.0) == 0.25  # shared: the floor
    release(evictor, 2, b"other", "C", 3.0)
    assert [c.conversation_id for c in evictor._state[2].tag] == ["C"]
    assert evictor.memory_size() == 2

    forgetful = shared_then_evicted(None)
    release(forgetful, 1, b"prefix", "C", 3.0)
    assert [c.conversation_id for c in forgetful._state[1].tag] == ["C"]
    assert forgetful.memory_size() == 0

    late = shared_then_evicted(10.0)
    release(late, 1, b"prefix", "C", 12.0)  # the claims were released 11 and 12 s before
    assert [c.conversation_id for c in late._state[1].tag] == ["C"]

    # A protected claim is not remembered; a block still cached keeps its own claims.
    guarded = ReturnWindowEvictor(4, initial_window_s=10.0, claim_memory_s=10.0)
    guarded.reset([1, 2, 3])
    guarded.push_protected(FreedBlocks([0], [0], [b"p"]), Release(0.0, None, "A"))
    guarded.pop_n(4, 1.0)
    release(guarded, 1, b"p", "C", 2.0)
    assert [c.conversation_id for c in guarded._state[1].tag] == ["C"]
    guarded.reset([0, 1, 2, 3])
    assert guarded.memory_size() == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"claim_memory_s": 0.0}, "claim_memory_s must be a finite number > 0"),
        ({"claim_memory_s": float("nan")}, "claim_memory_s must be a finite number > 0"),
        ({"claim_memory_s": 60.0, "memory_blocks_factor": 0.0}, "memory_blocks_factor"),
    ],
)
def test_bad_claim_memory_options_are_refused(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReturnWindowEvictor(8, **options)


def test_the_online_floor_is_the_share_of_shared_releases_reused_within_w() -> None:
    reuse = SharedReuse()
    shared = (Claim("A", None, 0.0), Claim("B", None, 0.0))
    alone = (Claim("C", None, 0.0),)
    assert reuse.value == 0.5  # the prior alone
    reuse.observe(0.0, [b"h", b"g", None], [shared, alone, shared], 10.0)
    assert reuse.waiting() == 1  # only the shared block with a content waits
    reuse.observe(5.0, [b"h"], [alone], 10.0)  # released again within W
    reuse.observe(10.0, [b"x"], [alone], 10.0)  # at the deadline: not judged yet
    assert (reuse.judged, reuse.value) == (0, 0.5)
    reuse.observe(11.0, [b"x"], [alone], 10.0)
    assert (reuse.judged, reuse.reused, reuse.value) == (1, 1, 0.75)
    reuse.observe(20.0, [b"h"], [shared], 10.0)
    reuse.observe(31.0, [b"h"], [alone], 10.0)  # judged first: the release came too late
    assert (reuse.judged, reuse.reused, reuse.value) == (2, 1, 0.5)
    assert reuse.waiting() == 0 and not reuse._newest

    evictor = ReturnWindowEvictor(8, initial_window_s=10.0, shared_floor="online")
    assert evictor.floor == 0.5
    evictor.shared_reuse.reused, evictor.shared_reuse.judged = 3, 3
    never = step_curve(1000.0)
    assert evictor.score([Claim("A", never, 0.0), Claim("B", never, 0.0)], 1.0) == 3.5 / 4
    evictor.reset(range(8))
    assert evictor.floor == 0.5
    with pytest.raises(ValueError, match="shared_floor must be a probability, 'online' or None"):
        ReturnWindowEvictor(8, shared_floor="sometimes")
