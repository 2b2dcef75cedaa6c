"""T-LRU (`eviction/tlru.py`) and SGLang's `tlru` (`eviction/sglang_tlru.py`) evict exactly
what a plain transcription of SGLang 0.5.23's `TLRUStrategy.get_priority` evicts: every free
cached block ranked by (-1 if TEL-safe else 0, last release) at each eviction."""

from __future__ import annotations

import pytest
from hypothesis import given

from eviction import FreedBlocks, LRUEvictor, Release, make_evictor
from eviction.sglang_tlru import SGLangTLRUEvictor
from eviction.tlru import TLRUEvictor
from lpc.blocks.block_manager import PrefixCacheBlockManager
from lpc.replay.tlru_fit import fit_tlru, new_prompt_blocks
from lpc.workload import ScriptedTurn, WorkloadRequest
from tests.eviction.kv_policy_streams import drive, exercised_enough
from tests.eviction.reference_kv_policies import PlainBase
from tests.eviction.test_lpc_reference import replay
from tests.lpc.streams import random_stream
from tests.properties import SEEDS, examples, exercised


class PlainTLRU(PlainBase):
    """`get_priority` over every free block: (-1 if depth >= max(L + Q - xi, 0) else 0, seq).
    L is the releasing chain's length (both calls of a release), or with `high_water` the
    longest chain released through the block since its content was cached."""

    def __init__(self, num_blocks: int, threshold: int, estimate: int, high_water: bool) -> None:
        self.threshold, self.estimate, self.high_water = threshold, estimate, high_water
        super().__init__(num_blocks)

    def clear(self) -> None:
        self.seq = 0
        self.history: dict[int, int] = {}
        self.depth: dict[int, int] = {}
        self.release: Release | None = None
        self.length = 0
        self.first_call: list[int] = []

    def _chain(self, freed: FreedBlocks, release: Release) -> None:
        longest = max(freed.depths, default=-1) + 1
        if release is not self.release:
            self.release, self.length, self.first_call = release, longest, []
        elif longest > self.length:
            self.length = longest
            for block_id in self.first_call:
                self.history[block_id] = self._history(block_id)

    def _history(self, block_id: int) -> int:
        if self.high_water:
            return max(self.history.get(block_id, 0), self.length)
        return self.length

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        self._chain(freed, release)
        for block_id, depth in zip(freed.block_ids, freed.depths, strict=True):
            self.depth[block_id] = depth
            self.history[block_id] = self._history(block_id)
            self.seq += 1
            self.free[block_id] = self.seq
        self.first_call.extend(freed.block_ids)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        self._chain(freed, release)
        for block_id, depth in zip(freed.block_ids, freed.depths, strict=True):
            self.depth[block_id] = depth
            if self.high_water:
                self.history[block_id] = self._history(block_id)

    def priority(self, block_id: int) -> tuple[int, int]:
        budget = max(self.history[block_id] + self.estimate - self.threshold, 0)
        return (-1 if self.depth[block_id] >= budget else 0, self.free[block_id])

    def evict(self, now_s: float) -> int:
        victim = min(self.free, key=self.priority)
        del self.free[victim]
        self.dropped(victim)
        return victim

    def dropped(self, block_id: int) -> None:
        self.history.pop(block_id, None)


VARIANTS = [(TLRUEvictor, False), (SGLangTLRUEvictor, True)]


@pytest.mark.parametrize(("cls", "high_water"), VARIANTS)
@pytest.mark.parametrize(("threshold", "estimate"), [(3, 1), (6, 2)])
@examples(3)
@given(seed=SEEDS)
def test_victims_match_the_plain_reference_on_random_streams(
    cls: type, high_water: bool, threshold: int, estimate: int, seed: int
) -> None:
    fast = cls(24, threshold_blocks=threshold, next_prompt_blocks=estimate)
    plain = PlainTLRU(24, threshold, estimate, high_water)
    exercised_enough(drive(fast, plain, seed, 24))


@pytest.mark.parametrize(("cls", "high_water"), VARIANTS)
@examples(2)
@given(seed=SEEDS)
def test_block_manager_allocations_match_the_plain_reference(
    cls: type, high_water: bool, seed: int
) -> None:
    steps = random_stream(seed, 400)
    fast = PrefixCacheBlockManager(48, block_size=4, evictor=cls(48, 4, 1))
    plain = PrefixCacheBlockManager(48, block_size=4, evictor=PlainTLRU(48, 4, 1, high_water))
    fast_trace, plain_trace = replay(fast, steps), replay(plain, steps)
    assert fast_trace == plain_trace
    assert fast.counters == plain.counters
    exercised("evictions", sum(len(a.evicted_block_ids) for a in fast_trace if a is not None), 20)


def chain(ids: list[int]) -> FreedBlocks:
    """A request's blocks in prefix order, freed tail first as the block manager frees them."""
    return FreedBlocks(ids[::-1], list(range(len(ids)))[::-1], [bytes([i]) for i in ids[::-1]])


def test_the_tail_past_the_budget_goes_first_then_lru() -> None:
    """L = 6 blocks, Q = 1, xi = 3: the next turn needs the first 4 blocks; blocks 4 and 5 of
    each chain are TEL-safe and leave before any block of the older chain's budget."""
    tlru = TLRUEvictor(12, threshold_blocks=3, next_prompt_blocks=1)
    tlru.reset(range(12))
    b = tlru.pop_n(12)
    tlru.push_cached(chain(b[0:6]), Release(0.0, None, "a"))
    tlru.push_cached(chain(b[6:12]), Release(1.0, None, "b"))
    assert tlru.pop_n(12) == [b[5], b[4], b[11], b[10], *b[3::-1], *b[9:5:-1]]


@pytest.mark.parametrize("cls", [TLRUEvictor, SGLangTLRUEvictor])
@examples(2)
@given(seed=SEEDS)
def test_with_the_default_constants_it_is_lru_on_random_streams(cls: type, seed: int) -> None:
    exercised_enough(drive(cls(24), LRUEvictor(24), seed, 24))


def test_a_shorter_release_keeps_the_high_water_mark_in_sglang_only() -> None:
    """A 6-block chain, then a 3-block request through its first 3 blocks: for the paper's
    T-LRU block 2 now belongs to a 3-block history (budget 3 + 1 - 3 = 1: TEL-safe); SGLang's
    high-water L stays 6 (budget 4: block 2 is kept)."""
    for cls, block_2_safe in ((TLRUEvictor, True), (SGLangTLRUEvictor, False)):
        tlru = cls(6, threshold_blocks=3, next_prompt_blocks=1)
        tlru.reset(range(6))
        b = tlru.pop_n(6)
        tlru.push_cached(chain(b), Release(0.0, None, "a"))
        for block in b[:3]:
            tlru.remove(block)
        tlru.push_cached(chain(b[:3]), Release(1.0, None, "a"))
        assert tlru.is_tel_safe(b[2]) == block_2_safe, cls.name
        assert tlru.is_tel_safe(b[1]) == (cls is TLRUEvictor)  # depth 1 >= budget 1


def test_a_release_split_in_two_calls_counts_the_whole_chain() -> None:
    """The freed blocks (depths 4-5) arrive first, the deeper ones other requests still hold
    (6-7) in the second call: the freed blocks' safety is decided again with L = 8."""
    tlru = TLRUEvictor(10, threshold_blocks=2, next_prompt_blocks=0)
    tlru.reset(range(10))
    b = tlru.pop_n(10)
    release = Release(0.0, None, "a")
    tlru.push_cached(FreedBlocks([b[5], b[4]], [5, 4], [None, None]), release)
    assert tlru.is_tel_safe(b[4])  # L = 6 so far: budget 4
    tlru.note_shared_release(FreedBlocks([b[7], b[6]], [7, 6], [None, None]), release)
    assert not tlru.is_tel_safe(b[4]) and not tlru.is_tel_safe(b[5])  # L = 8: budget 6
    tlru.check_invariants()


@pytest.mark.parametrize("name", ["tlru", "sglang-tlru"])
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"threshold_blocks": -1}, "threshold_blocks must be an int >= 0"),
        ({"next_prompt_blocks": 1.5}, "next_prompt_blocks must be an int >= 0"),
        ({"threshold_blocks": True}, "threshold_blocks must be an int >= 0"),
    ],
)
def test_bad_constants_are_refused_in_one_line(name: str, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        make_evictor(name, 4, **options)
    assert name in str(error.value) and "\n" not in str(error.value)


def test_the_training_part_fits_the_next_prompt_and_the_budget() -> None:
    """Follow-up turns adding 1, 2, 2, 3 and 10 new blocks (4-token blocks): Q = the median
    (2), xi = the 0.9 quantile rounded up (ceil(7.2) = 8); first turns add nothing."""
    requests = []
    t = 0.0
    for conv, added in (("a", [1, 2]), ("b", [2, 3, 10])):
        history = 8  # tokens of the first turn's prompt and reply: 2 blocks
        requests.append(_request(conv, 0, 4, history, t))
        for turn, blocks in enumerate(added, start=1):
            t += 1.0
            prompt = history + 4 * blocks
            history = prompt + 4  # one block of reply
            requests.append(_request(conv, turn, prompt, history, t))
    assert sorted(new_prompt_blocks(requests, 4)) == [1, 2, 2, 3, 10]
    fit = fit_tlru(requests, 4, "test")
    assert (fit.next_prompt_blocks, fit.threshold_blocks, fit.follow_ups) == (2, 8, 5)
    assert fit_tlru(requests[:1], 4, "test").evictor_options() == {
        "threshold_blocks": 0,
        "next_prompt_blocks": 0,
    }


def _request(conv: str, turn: int, prompt: int, total: int, t: float) -> WorkloadRequest:
    scripted = ScriptedTurn(conv, turn, list(range(total)), prompt, True)
    return WorkloadRequest(f"{conv}{turn}", scripted, t, t + 0.5)
