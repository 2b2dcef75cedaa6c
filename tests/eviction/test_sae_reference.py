"""SAE (`eviction/sae.py`) evicts exactly what a plain transcription of vLLM PR #50422's
`SAECachePolicy` evicts: sessions sorted by score at every eviction, each walked from its
tail, with touch, merge, ghost seeding and decay as the PR has them."""

from __future__ import annotations

import pytest
from hypothesis import given

from eviction import FreedBlocks, Release, SAEEvictor
from lpc.blocks.block_manager import PrefixCacheBlockManager
from tests.eviction.kv_policy_streams import drive, exercised_enough
from tests.eviction.reference_kv_policies import PlainSAE
from tests.eviction.test_lpc_reference import replay
from tests.lpc.streams import random_stream
from tests.properties import SEEDS, examples, exercised


@pytest.mark.parametrize("decay_interval", [7, 500])
@examples(12)
@given(seed=SEEDS)
def test_victims_match_the_plain_reference_on_random_streams(
    seed: int, decay_interval: int
) -> None:
    fast = SAEEvictor(24, decay_interval=decay_interval)
    plain = PlainSAE(24, decay_interval=decay_interval)
    exercised_enough(drive(fast, plain, seed, 24))


class _SweepingSAE(SAEEvictor):
    GHOST_SWEEP_MIN = 8  # sweeps the ghost table often on a small stream


class _EagerSAE(SAEEvictor):
    """Every ghost entry decayed (or pruned) at every decay, as the PR does it."""

    def _decay(self) -> None:
        super()._decay()
        for block_hash in list(self._ghost):
            self._ghost_current(block_hash)


GHOST_KEYS = [bytes([h]) for h in range(120)]


class _InStep:
    """The eager SAE and the lazy ones driven as one evictor (one stream, one plain
    reference): every call goes to each, every pop and size must agree, and the invariants
    are the lazy ones' (the eager one is this test's stand-in, not a shipped evictor)."""

    def __init__(self, eager: SAEEvictor, *lazies: SAEEvictor) -> None:
        self.evictors = (eager, *lazies)
        self.lazies = lazies

    def reset(self, block_ids) -> None:
        block_ids = list(block_ids)
        for evictor in self.evictors:
            evictor.reset(block_ids)

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        eager, *lazy = [evictor.pop_n(n, now_s) for evictor in self.evictors]
        assert all(out == eager for out in lazy), f"lazy pops {lazy} != eager {eager}"
        return eager

    def remove(self, block_id: int) -> None:
        for evictor in self.evictors:
            evictor.remove(block_id)

    def push_uncached(self, block_ids) -> None:
        for evictor in self.evictors:
            evictor.push_uncached(block_ids)

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        for evictor in self.evictors:
            evictor.push_cached(freed, release)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        for evictor in self.evictors:
            evictor.note_shared_release(freed, release)

    def __len__(self) -> int:
        sizes = {len(evictor) for evictor in self.evictors}
        assert len(sizes) == 1, f"sizes differ: {sizes}"
        return sizes.pop()

    def check_invariants(self) -> None:
        for evictor in self.lazies:
            evictor.check_invariants()


@examples(12)
@given(seed=SEEDS)
def test_lazily_decayed_ghost_scores_are_bit_for_bit_the_eager_ones(seed: int) -> None:
    """The ghost table decays when read (and in sweeps); every score, and every pruning, is
    exactly the eager table's, compared with `==` (and with the plain reference's to the last
    bits, which computes a hit's bump as 12 / log2 rather than 1 / log2 * 12). The eager run
    and both lazy ones (without and with sweeps) meet the same stream, each pop checked against
    the plain reference as it comes; the invariants are checked at every step of the lazy
    runs (the eager one is this test's stand-in, not a shipped evictor); the three run in
    step (`_InStep`), so the plain reference replays the stream once."""
    eager = _EagerSAE(24, decay_interval=2)
    lazies = [SAEEvictor(24, decay_interval=2), _SweepingSAE(24, decay_interval=2)]
    plain = PlainSAE(24, decay_interval=2)
    drive(_InStep(eager, *lazies), plain, seed, 24, steps=1200, hashes=120)
    eager_scores = {key: eager.ghost_score(key) for key in GHOST_KEYS}
    eager_hits = {session_id: session.hits for session_id, session in eager._sessions.items()}
    for lazy in lazies:
        for key in GHOST_KEYS:
            assert lazy.ghost_score(key) == eager_scores[key], f"{type(lazy)}: {key!r}"
            assert lazy.ghost_score(key) == pytest.approx(plain.ghost.get(key, 0.0), rel=1e-12)
        assert lazy._sessions.keys() == eager_hits.keys()
        for session_id, session in lazy._sessions.items():
            assert session.hits == eager_hits[session_id]
    # about fifty decays: entries are pruned
    exercised("lookups since the last decay", plain.lookups_since_decay, 99)
    exercised("ghost keys pruned", sum(key not in plain.ghost for key in GHOST_KEYS), 0)
    exercised("ghost keys kept", len(plain.ghost), 0)


def test_a_ghost_entry_decayed_under_the_threshold_while_resident_is_kept_until_a_decay() -> None:
    """The PR prunes at a decay only the entries whose hash is not resident: an entry that fell
    under the threshold while its block was resident keeps its score after the eviction until
    the next decay (lazily: the entry catches up at the eviction, before its residency ends)."""
    sae = SAEEvictor(2, decay_interval=1)
    sae.reset(range(2))
    b = sae.pop_n(2)
    sae.push_cached(FreedBlocks([b[0]], [0], [b"x"]), Release(0.0, None, "a"))
    sae.push_cached(FreedBlocks([b[1]], [0], [b"y"]), Release(1.0, None, "b"))
    for t in range(45):  # 47 decays in all, one per touch
        sae.remove(b[1])
        sae.push_cached(FreedBlocks([b[1]], [0], [b"y"]), Release(2.0 + t, None, "b"))
    assert sae.pop_n(1) == [b[0]]  # x's session was touched least
    expected = 1.0  # x's miss at depth 0, then 47 decays, multiplied one at a time
    for _ in range(47):
        expected *= 0.9
    assert sae.ghost_score(b"x") == expected < SAEEvictor.GHOST_PRUNE_THRESHOLD
    sae.remove(b[1])
    sae.push_cached(FreedBlocks([b[1]], [0], [b"y"]), Release(50.0, None, "b"))  # a decay
    assert sae.ghost_score(b"x") == 0.0


def test_a_store_seeds_from_the_ghost_table_as_pruned_by_its_own_touchs_decay() -> None:
    """A touch's decay comes before its store: a fresh entry under the threshold is pruned (its
    hash not yet resident) and seeds nothing."""
    sae = SAEEvictor(1, decay_interval=1, ghost_miss_weight=0.001)
    sae.reset(range(1))
    (block,) = sae.pop_n(1)
    sae.push_cached(FreedBlocks([block], [0], [b"x"]), Release(0.0, None, "a"))
    (session,) = sae._sessions.values()
    assert session.hits == 0.0
    assert sae.ghost_score(b"x") == 0.0


@pytest.mark.parametrize("decay_interval", [5, 500])
@examples(8)
@given(seed=SEEDS)
def test_block_manager_allocations_match_the_plain_reference(
    seed: int, decay_interval: int
) -> None:
    steps = random_stream(seed, 400)
    fast = PrefixCacheBlockManager(
        48, block_size=4, evictor=SAEEvictor(48, decay_interval=decay_interval)
    )
    plain = PrefixCacheBlockManager(
        48, block_size=4, evictor=PlainSAE(48, decay_interval=decay_interval)
    )
    fast_trace = replay(fast, steps)
    plain_trace = replay(plain, steps)
    assert fast_trace == plain_trace
    assert fast.counters == plain.counters
    exercised("evictions", sum(len(a.evicted_block_ids) for a in fast_trace if a is not None), 20)


def chain(ids: list[int], first_depth: int = 0) -> FreedBlocks:
    depths = list(range(first_depth, first_depth + len(ids)))
    return FreedBlocks(ids[::-1], depths[::-1], [bytes([i]) for i in ids[::-1]])


def test_a_continuation_merges_into_its_session_and_the_tail_goes_first() -> None:
    sae = SAEEvictor(10)
    sae.reset(range(10))
    b = sae.pop_n(10)
    sae.push_cached(chain(b[0:3]), Release(0.0, None, "a"))  # session 0 at depth 0
    sae.push_cached(chain(b[3:6]), Release(1.0, None, "b"))  # session 1 at depth 0
    for x in b[0:3]:
        sae.remove(x)  # a's next turn hits its three blocks...
    sae.push_cached(chain(b[0:3] + b[6:8]), Release(2.0, None, "a"))  # ...and stores two more
    assert sae.logical_time == 3
    # both sessions started at depth 0; session 0 was touched once more and is kept longer;
    # within a session the blocks leave from the tail
    assert sae.pop_n(5) == [b[5], b[4], b[3], b[7], b[6]]


def test_a_session_stored_deeper_gets_a_smaller_prefix_bonus() -> None:
    sae = SAEEvictor(8)
    sae.reset(range(8))
    b = sae.pop_n(8)
    sae.push_cached(chain(b[0:4]), Release(0.0, None, "a"))
    # another request hits a's first two blocks and stores two of its own at depth 2:
    # merged into a's session (the deepest hit's)
    sae.remove(b[0])
    sae.remove(b[1])
    sae.push_cached(chain([b[0], b[1], b[4], b[5]]), Release(1.0, None, "x"))
    assert len(sae._sessions) == 1
    # a request with no hit stores at depth 3 (its first three blocks were not cached here)
    sae.push_cached(chain(b[6:8], first_depth=3), Release(2.0, None, "y"))
    scores = sorted((sae.session_score(s), s) for s in sae._sessions)
    assert scores[0][1] == 1  # the session opened at depth 3 is the worst
    assert sae.pop_n(2) == [b[7], b[6]]


def test_ghost_scores_outlive_eviction_and_seed_a_returning_session() -> None:
    sae = SAEEvictor(4)
    sae.reset(range(4))
    b = sae.pop_n(4)
    digest = FreedBlocks([b[0]], [0], [b"x"])
    sae.push_cached(digest, Release(0.0, None, "a"))
    assert sae.ghost_score(b"x") == pytest.approx(1.0)  # a miss at position 0
    sae.remove(b[0])
    sae.push_cached(digest, Release(1.0, None, "a"))
    assert sae.ghost_score(b"x") == pytest.approx(13.0)  # then a hit
    assert sae.pop_n(1, 2.0) == [b[0]]
    sae.push_cached(FreedBlocks([b[1]], [0], [b"x"]), Release(3.0, None, "b"))
    (session,) = sae._sessions.values()
    assert session.hits == pytest.approx(14.0 / 12.0)  # seeded from the ghost (+1 miss)


def test_sae_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="decay_interval"):
        SAEEvictor(4, decay_interval=0)
    with pytest.raises(ValueError, match="decay_factor"):
        SAEEvictor(4, decay_factor=1.5)
