"""The fast two-tier grid (one GPU replay per GPU policy and size, the CPU tier replayed
against its record) gives exactly the figures of the one-pair-at-a-time reference, every
counter, hit and TTFT figure, in the reference's order, serially and in worker processes."""

from __future__ import annotations

import zlib
from dataclasses import replace

import pytest

from lpc.replay import two_tier_grid as grid
from lpc.replay.ab import ReplayConstants
from lpc.replay.policies import parse_policies
from lpc.replay.return_sources import true_return_curves
from lpc.replay.simulator import PreparedWorkload, prepare
from lpc.replay.two_tier import TierSettings, TwoTierResult, run_two_tier_grid
from lpc.replay.two_tier_grid import (
    FAILED,
    failed_requests,
    replay_gpu_tier,
    replay_host_tier_for,
    run_pair_grid,
    shares_host_pass,
)
from lpc.traces.load import TraceOptions, load_trace
from lpc.workload import WorkloadConfig, open_loop_requests
from tests.lpc.synthetic import conversations
from tests.lpc.traces.helpers import bundled_lines, write_lines


def _probabilities(requests) -> list[float]:
    """A fixed, request-dependent probability for the learned policies (any will do: both
    paths must read the same one)."""
    return [zlib.crc32(r.request_id.encode()) % 1000 / 1000 for r in requests]


def _categories(requests) -> list[str]:
    return [f"t{min(r.turn.turn_index, 3)}" for r in requests]


@pytest.fixture(scope="module")
def synthetic() -> PreparedWorkload:
    requests = open_loop_requests(
        conversations(48, seed=9), WorkloadConfig(duration_s=120, max_active_conversations=16)
    )
    return prepare(
        requests,
        16,
        {"model": _probabilities(requests)},
        first_counted=len(requests) // 3,
        categories=_categories(requests),
        curves={"true-return": true_return_curves(requests)},
    )


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory) -> PreparedWorkload:
    """The first 700 requests of the bundled Mooncake trace, at its block size."""
    path = write_lines(tmp_path_factory.mktemp("grid") / "slice.jsonl", bundled_lines()[:700])
    requests = load_trace(path, TraceOptions()).requests
    return prepare(
        requests,
        512,
        {"model": _probabilities(requests)},
        first_counted=len(requests) // 2,
        categories=_categories(requests),
    )


def _without_time(results: list[TwoTierResult]) -> list[TwoTierResult]:
    return [replace(r, seconds=0.0) for r in results]


CASES = {
    # GPU sizes small enough that some requests do not fit (the failure path), CPU sizes from
    # a few chunks (evictions, failed stores) to room for most of the trace
    # (lpc-return-true: each release carries its return curve, in either tier; vllm-arc:
    # vLLM's ARCCachePolicy in the CPU tier)
    "synthetic": (
        "lpc-pooled,wa,lhd,lpc-return-true",
        "arc,sae,session-ref,lpc-pooled,lpc-return-true,vllm-arc",
        (900, 3000),
        (320, 4000),
    ),
    "mooncake": (
        "sae,session-ref,lpc-pooled",
        "lhd,wa,arc",
        (60_000, 300_000),
        (40_000, 1_500_000),
    ),
}


@pytest.mark.parametrize(
    "name", ["synthetic", pytest.param("mooncake", marks=pytest.mark.slow)]
)  # the Mooncake slice takes a few seconds: out of the default run
@pytest.mark.parametrize("threshold", [0, 2])
def test_the_fast_grid_gives_the_reference_figures(
    name: str, threshold: int, request: pytest.FixtureRequest
) -> None:
    workload: PreparedWorkload = request.getfixturevalue(name)
    gpu, cpu, gpu_sizes, cpu_sizes = CASES[name]
    specs = tuple(parse_policies(gpu))
    tiers = TierSettings(
        cpu_sizes, tuple(parse_policies(cpu, cpu_tier=True)), store_threshold=threshold
    )
    settings = ReplayConstants()
    reference = run_two_tier_grid(workload, specs, gpu_sizes, tiers, settings)
    seen: list[TwoTierResult] = []
    fast, timing = run_pair_grid(workload, specs, gpu_sizes, tiers, settings, 1, seen.append)
    assert _without_time(fast) == _without_time(reference)
    assert sorted(map(repr, _without_time(seen))) == sorted(map(repr, _without_time(fast)))
    assert timing.gpu_replays == len(specs) * len(gpu_sizes)
    # a CPU policy under HostTier's rules runs once per GPU size and set of failed requests
    failed_sets = [
        {failed_requests(replay_gpu_tier(workload, spec, size, settings)) for spec in specs}
        for size in gpu_sizes
    ]
    shared = sum(shares_host_pass(spec) for spec in tiers.offload_policies)
    own = len(tiers.offload_policies) - shared
    expected = sum(len(sets) * shared + len(specs) * own for sets in failed_sets)
    assert timing.host_passes == expected
    assert expected < len(specs) * len(gpu_sizes) * len(tiers.offload_policies)
    # the check has teeth: failures, host hits and host evictions all happen
    assert any(r.allocation_failures for r in reference)
    assert any(r.host_hit_tokens for r in reference)
    assert any(r.host_evictions for r in reference)
    assert len({r.host_hit_tokens for r in reference}) > 1


def test_worker_processes_give_the_same_figures(synthetic: PreparedWorkload) -> None:
    specs = tuple(parse_policies("lru,lpc-pooled"))
    tiers = TierSettings((320, 4000), tuple(parse_policies("arc,session-ref")))
    serial, _ = run_pair_grid(synthetic, specs, (900, 3000), tiers, ReplayConstants(), 1)
    forked, timing = run_pair_grid(synthetic, specs, (900, 3000), tiers, ReplayConstants(), 2)
    assert _without_time(forked) == _without_time(serial)
    assert timing.workers == 2 and timing.gpu_replays == 4
    assert timing.host_passes < 8  # the two GPU policies share passes where they failed alike


def test_a_gpu_trace_marks_the_requests_the_pool_could_not_hold(
    synthetic: PreparedWorkload,
) -> None:
    (lru,) = parse_policies("lru")
    trace = replay_gpu_tier(synthetic, lru, 900, ReplayConstants())
    (reference,) = run_two_tier_grid(
        synthetic, (lru,), (900,), TierSettings((320,), (lru,)), ReplayConstants()
    )
    counted = range(synthetic.first_counted, len(synthetic.requests))
    assert sum(trace.device_blocks[i] == FAILED for i in counted) == reference.allocation_failures
    held = [i for i in counted if trace.device_blocks[i] != FAILED]
    assert sum(trace.device_blocks[i] for i in held) * 16 == reference.device_hit_tokens


def test_gpu_replays_that_failed_different_requests_get_passes_of_their_own(
    synthetic: PreparedWorkload, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grid groups GPU replays by the requests they failed; here `lru`'s replay is made to
    count as failing others, so it gets its own CPU-tier pass."""
    real = grid.failed_requests
    monkeypatch.setattr(
        grid, "failed_requests", lambda trace: (trace.policy == "lru", *real(trace))
    )
    specs = tuple(parse_policies("lru,lpc-pooled,wa"))
    tiers = TierSettings((320, 4000), tuple(parse_policies("arc,session-ref", cpu_tier=True)))
    reference = run_two_tier_grid(synthetic, specs, (900,), tiers, ReplayConstants())
    fast, timing = run_pair_grid(synthetic, specs, (900,), tiers, ReplayConstants(), 1)
    assert _without_time(fast) == _without_time(reference)
    assert timing.host_passes == 4  # per CPU policy: lru alone, lpc-pooled with wa


def test_one_pass_refuses_gpu_replays_it_cannot_serve(synthetic: PreparedWorkload) -> None:
    (lru,) = parse_policies("lru")
    trace = replay_gpu_tier(synthetic, lru, 900, ReplayConstants())
    held = next(i for i, blocks in enumerate(trace.device_blocks) if blocks != FAILED)
    device_blocks = list(trace.device_blocks)
    device_blocks[held] = FAILED
    other = replace(trace, device_blocks=device_blocks)
    (arc,) = parse_policies("arc", cpu_tier=True)
    with pytest.raises(ValueError, match="failed different requests"):
        replay_host_tier_for(synthetic, [trace, other], arc, (320,), ReplayConstants())
    (pooled,) = parse_policies("lpc-pooled", cpu_tier=True)
    with pytest.raises(ValueError, match="reads its loads"):
        replay_host_tier_for(synthetic, [trace, trace], pooled, (320,), ReplayConstants())
