"""Our block manager with the `lru` evictor against real vLLM 0.33.0, block for block.

Each seed's stream (2,000 operations of multi-tenant multi-turn chat, see
lpc.difftest.streams) is replayed on vLLM's `KVCacheManager` by scripts/vllm_replay.py in the
vLLM venv, and on our `PrefixCacheBlockManager` + `LRUEvictor` here. After every operation the
two must agree exactly on the request's block table, its hit tokens, the blocks it evicted,
whether a freed request held blocks, the free queue's order and the set of cached blocks. The
docs example (tests/test_docs_example.py) is replayed on vLLM too, and deliberately wrong
free-queue policies must be caught, or agreement would prove nothing.

Marked `vllm`: run with `pytest -m vllm tests/vllm` after `bash scripts/setup_vllm_venv.sh`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import pytest

from eviction import Evictor, FIFOEvictor, FreedBlocks, LRUEvictor, Release
from lpc.difftest.checks import (
    check_salt_isolation,
    first_divergence,
    replay_totals,
)
from lpc.difftest.docs_example import docs_example_stream
from lpc.difftest.ops import OUTCOME_FIELDS, Stream
from lpc.difftest.replay import replay_stream
from lpc.difftest.streams import generate_stream
from tests.vllm.vllm_support import REPORT, VllmRun

pytestmark = pytest.mark.vllm

NUM_SEEDS = int(os.environ.get("LPC_VLLM_DIFF_SEEDS", "20"))
STEPS = 2000
SEEDS = range(NUM_SEEDS)
DOCS_STREAMS = (docs_example_stream(29), docs_example_stream(33))


@pytest.fixture(scope="module")
def streams() -> dict[int, Stream]:
    return {seed: generate_stream(seed) for seed in SEEDS}


@pytest.fixture(scope="module")
def vllm_run(
    run_vllm: Callable[[Sequence[Stream]], VllmRun], streams: dict[int, Stream]
) -> VllmRun:
    """One vLLM process replays every seed and the docs example."""
    return run_vllm([*streams.values(), *DOCS_STREAMS])


@pytest.mark.parametrize("seed", SEEDS)
def test_lru_manager_matches_vllm_step_by_step(
    seed: int, streams: dict[int, Stream], vllm_run: VllmRun
) -> None:
    stream = streams[seed]
    theirs = vllm_run.records[stream.config.name]
    start = time.perf_counter()
    ours = list(replay_stream(stream, LRUEvictor))
    our_seconds = time.perf_counter() - start

    divergence = first_divergence(stream, ours, theirs)
    if divergence is not None:
        pytest.fail(f"seed {seed}: {divergence.message()}", pytrace=False)

    totals = replay_totals(stream, theirs)
    salts = check_salt_isolation(stream, theirs)
    assert salts.violations == (), f"seed {seed}: vLLM leaked across salts: {salts.violations}"
    REPORT.seeds += 1
    REPORT.steps = max(REPORT.steps, len(stream.ops))
    REPORT.totals.add(totals)
    REPORT.lines.append(
        f"seed {seed:2d} (block size {stream.config.block_size:2d}, "
        f"{stream.config.num_blocks - 1} usable blocks): identical; {totals.summary()}; "
        f"{salts.cross_salt_opportunities} cross-salt opportunities; "
        f"vLLM {vllm_run.seconds_per_stream[stream.config.name]:.2f}s, ours {our_seconds:.2f}s"
    )
    # A stream that never hits or never evicts would compare little.
    assert totals.hit_requests > 0 and totals.evictions > 0


def test_streams_are_not_trivial_in_total(streams: dict[int, Stream], vllm_run: VllmRun) -> None:
    """Over all seeds vLLM itself hit, evicted and refused allocations many times."""
    totals = [replay_totals(s, vllm_run.records[s.config.name]) for s in streams.values()]
    assert sum(len(s.ops) for s in streams.values()) == STEPS * NUM_SEEDS
    assert sum(t.hit_requests for t in totals) > 500 * NUM_SEEDS
    assert sum(t.evictions for t in totals) > 1000 * NUM_SEEDS
    assert sum(t.failures for t in totals) > NUM_SEEDS
    seeds_seconds = sum(vllm_run.seconds_per_stream[s.config.name] for s in streams.values())
    REPORT.lines.append(
        f"vLLM {vllm_run.vllm_version}: import {vllm_run.import_seconds:.1f}s, replay of "
        f"{len(streams)} seeds {seeds_seconds:.1f}s, driver wall "
        f"time {vllm_run.wall_seconds:.1f}s"
    )


@pytest.mark.parametrize("stream", DOCS_STREAMS, ids=lambda s: s.config.name)
def test_docs_example_matches_vllm(stream: Stream, vllm_run: VllmRun) -> None:
    """tests/test_docs_example.py states our records for these streams; vLLM must agree."""
    ours = list(replay_stream(stream))
    divergence = first_divergence(stream, ours, vllm_run.records[stream.config.name])
    if divergence is not None:
        pytest.fail(divergence.message(), pytrace=False)


class _UncachedToTail(LRUEvictor):
    """Wrong on purpose: unhashed blocks join the tail, as the older docs describe."""

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        n = len(block_ids)
        super().push_cached(FreedBlocks(list(block_ids), [0] * n, [None] * n), Release(0.0))


class _HeadFirstFree(LRUEvictor):
    """Wrong on purpose: a request's cached blocks are queued head first, not tail first."""

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        reverse = slice(None, None, -1)
        super().push_cached(
            FreedBlocks(freed.block_ids[reverse], freed.depths[reverse], freed.hashes[reverse]),
            release,
        )


@pytest.mark.parametrize(
    "make_evictor", [_UncachedToTail, _HeadFirstFree, FIFOEvictor], ids=lambda c: c.__name__
)
def test_a_wrong_policy_diverges_from_vllm(
    make_evictor: Callable[[int], Evictor], streams: dict[int, Stream], vllm_run: VllmRun
) -> None:
    """The comparison must catch plausible mistakes, or its agreement would prove nothing.

    Caught on the free queue at once, and also on what callers observe (block tables, hits,
    evictions) without looking at the queue.
    """
    stream = streams[SEEDS[0]]
    ours = list(replay_stream(stream, make_evictor))
    theirs = vllm_run.records[stream.config.name]
    name = make_evictor.__name__
    assert first_divergence(stream, ours, theirs) is not None, f"{name} passed for vLLM"
    observed = first_divergence(stream, ours, theirs, OUTCOME_FIELDS)
    assert observed is not None, f"{name} differs from vLLM only in its free-queue order"
    REPORT.lines.append(
        f"wrong policy {name}: caught, first in outcomes at step {observed.step} "
        f"({observed.operation}): {observed.field} ours={observed.ours} vLLM={observed.theirs}"
    )
