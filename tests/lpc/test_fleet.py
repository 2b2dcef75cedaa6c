"""The fleet replay: one instance is `lpc ab`'s replay exactly; routers, scaling, reports."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from lpc.errors import InvalidInputError
from lpc.fleet.fanout import Executor, run_cells
from lpc.fleet.pipeline import (
    FleetOptions,
    hit_ratio_interval,
    prepare_workload,
    run_fleet,
)
from lpc.fleet.replay import FleetCell, fleet_replay
from lpc.fleet.routers import (
    BALANCE_ABS_THRESHOLD,
    ROUTERS,
    Arrival,
    Load,
    make_router,
    session_home,
)
from lpc.fleet.scale import copy_shift_ms, scaled_records, write_scaled_trace
from lpc.replay.ab_options import ABOptions
from lpc.replay.ab_run import run_ab
from lpc.replay.policies import parse_policies
from lpc.replay.simulator import replay
from tests.lpc.traces.helpers import bundled_lines

# Two code paths of the replay: probabilities (lpc-turns) and return curves (lpc-return-km);
# lpc-pooled and lpc-return-model take the same paths with other sources.
POLICIES = "lru,s3fifo,lpc-turns,lpc-return-km"
SIZE = 2_000_000  # tokens per instance: above the small trace's peak in flight


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    """The bundled Mooncake hour's first 240 requests."""
    path = tmp_path_factory.mktemp("fleet") / "small.jsonl"
    path.write_text("\n".join(bundled_lines()[:240]) + "\n")
    return path


def ab_options(trace: Path, out: Path, policies: str = POLICIES) -> ABOptions:
    return ABOptions(
        trace=trace,
        policies=tuple(parse_policies(policies)),
        cache_sizes_tokens=(SIZE,),
        progress=False,
        workers=1,
        out_dir=out,
    )


@pytest.fixture(scope="module")
def prepared(small_trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("fleet-out")
    return prepare_workload(ab_options(small_trace, out), None, lambda _: None)


@pytest.mark.parametrize("router", ROUTERS)
def test_one_instance_is_the_single_instance_replay_request_by_request(prepared, router) -> None:
    s = prepared.settings
    for spec in parse_policies(POLICIES):
        options = s.policy_options.get(spec.evictor)
        single = replay(
            prepared.workload,
            spec,
            SIZE,
            s.scale_per_s,
            s.fallback_probability,
            policy_options=options,
        )
        fleet = fleet_replay(
            prepared.workload,
            FleetCell(router, spec, 1, SIZE),
            s.scale_per_s,
            s.fallback_probability,
            options,
        )
        assert fleet.per_request is not None and single.per_request is not None
        assert np.array_equal(fleet.per_request.hit_tokens, single.per_request.hit_tokens)
        assert (fleet.hit_tokens, fleet.queried_tokens, fleet.requests) == (
            single.hit_tokens,
            single.queried_tokens,
            single.requests,
        )
        assert (fleet.evictions, fleet.allocation_failures) == (
            single.evictions,
            single.allocation_failures,
        )
        assert fleet.instance_prompt_tokens == (single.queried_tokens,)


@pytest.mark.slow
def test_one_instance_gives_lpc_abs_hit_tokens(small_trace, tmp_path) -> None:
    """The whole `lpc ab` pipeline against the whole fleet pipeline: the same hit tokens."""
    ab = ab_options(small_trace, tmp_path / "ab")
    outcome = run_ab(ab, log=lambda _: None)
    expected = {r.policy: r.hit_tokens for r in outcome.results}
    fleet = run_fleet(
        FleetOptions(
            ab, (1,), ("round-robin", "prefix-aware"), out_dir=tmp_path / "f", progress=False
        ),
        log=lambda _: None,
    )
    for cell in fleet.cells:
        assert cell.result.hit_tokens == expected[cell.result.policy], cell.result.policy
    assert all(v > 0 for v in expected.values())


@pytest.mark.slow  # the whole pipeline, 8 cells and the plot: several seconds
def test_fleet_cells_count_every_request_once_and_report_files(small_trace, tmp_path) -> None:
    ab = ab_options(small_trace, tmp_path / "ab", "lru,lpc-turns")
    options = FleetOptions(ab, (2,), ROUTERS, out_dir=tmp_path / "f", progress=False)
    outcome = run_fleet(options, log=lambda _: None)
    assert len(outcome.cells) == len(ROUTERS) * 2
    first = outcome.cells[0].result
    for cell in outcome.cells:
        r = cell.result
        assert r.instances == 2 and len(r.instance_prompt_tokens) == 2
        assert sum(r.instance_prompt_tokens) == r.queried_tokens == first.queried_tokens
        assert sum(r.instance_hit_tokens) == r.hit_tokens
        low, high = cell.hit_ratio_ci95
        assert low <= r.token_hit_ratio <= high
        if r.policy == "lru":
            assert cell.gain_over_lru is None
        else:
            assert cell.gain_over_lru == pytest.approx(
                r.hit_tokens
                / next(
                    c.result.hit_tokens
                    for c in outcome.cells
                    if c.result.policy == "lru" and c.result.router == r.router
                )
                - 1
            )
    # two copies of the trace: twice the requests of the one-copy run, copies kept apart
    assert outcome.workloads[2]["replayed_requests"] == 480
    saved = json.loads(Path(outcome.files["json"]).read_text())
    assert len(saved["cells"]) == len(outcome.cells)
    assert Path(outcome.files["plot"]).stat().st_size > 0
    assert Path(outcome.files["csv"]).read_text().count("\n") == len(outcome.cells) + 1


def test_routers_spread_load_as_they_say(prepared) -> None:
    s = prepared.settings
    spec = parse_policies("lru")[0]
    by_router = {
        r.router: r
        for r in run_cells(
            prepared.workload, s, [FleetCell(router, spec, 4, SIZE) for router in ROUTERS]
        )
    }
    # session affinity keeps a conversation's prefix on one instance: more hits than spreading
    assert by_router["session-sticky"].hit_tokens > by_router["round-robin"].hit_tokens
    assert by_router["prefix-aware"].hit_tokens > by_router["round-robin"].hit_tokens
    assert by_router["round-robin"].load_imbalance < 1.3


def test_round_robin_and_least_loaded() -> None:
    rr = make_router("round-robin")
    load = Load([0, 0, 0], [0, 0, 0])
    picks = [rr.route(Arrival(i, "c", 10, 1), load, lambda i: 0) for i in range(5)]
    assert picks == [0, 1, 2, 0, 1]
    ll = make_router("least-loaded")
    assert ll.route(Arrival(0, "c", 10, 1), Load([5, 3, 3], [1, 1, 1]), lambda i: 0) == 1


def test_session_sticky_keeps_a_conversation_and_moves_it_when_out_of_balance() -> None:
    router = make_router("session-sticky")
    home = session_home("conv-7", 4)
    assert home == session_home("conv-7", 4)  # stable: no salted hash()
    calm = Load([0, 0, 0, 0], [0, 0, 0, 0])
    assert router.route(Arrival(0, "conv-7", 10, 1), calm, lambda i: 0) == home
    busy = [0, 0, 0, 0]
    busy[home] = BALANCE_ABS_THRESHOLD + 5
    tokens = [10, 10, 10, 10]
    tokens[home] = 1000
    tokens[(home + 1) % 4] = 1
    moved = router.route(Arrival(1, "conv-7", 10, 1), Load(tokens, busy), lambda i: 0)
    assert moved == (home + 1) % 4
    assert router.route(Arrival(2, "conv-7", 10, 1), calm, lambda i: 0) == moved  # stays


def test_prefix_aware_follows_the_longest_prefix_unless_too_short_or_out_of_balance() -> None:
    router = make_router("prefix-aware")
    cached = {0: 1, 1: 6, 2: 6, 3: 0}.__getitem__
    load = Load([50, 40, 30, 0], [1, 1, 1, 0])
    # 6 of 8 blocks cached on 1 and 2: the less loaded of the two
    assert router.route(Arrival(0, "c", 10, 8), load, cached) == 2
    # 6 of 20 blocks is under the cache threshold: least loaded
    assert router.route(Arrival(0, "c", 10, 20), load, cached) == 3
    unbalanced = Load([50, 40, 30, 0], [1, 1, BALANCE_ABS_THRESHOLD + 2, 0])
    assert router.route(Arrival(0, "c", 10, 8), unbalanced, cached) == 3


def test_unknown_router_and_belady_on_a_fleet_are_refused(prepared) -> None:
    with pytest.raises(InvalidInputError, match="unknown router 'random'"):
        make_router("random")
    belady = parse_policies("belady")[0]
    with pytest.raises(InvalidInputError, match="belady needs each instance's own future"):
        run_cells(prepared.workload, prepared.settings, [FleetCell("round-robin", belady, 2, SIZE)])
    with pytest.raises(InvalidInputError, match="unknown executor"):
        Executor("threads")


def test_scaled_trace_copies_are_disjoint_shifted_and_merged_in_time(small_trace, tmp_path) -> None:
    original = [json.loads(line) for line in small_trace.read_text().splitlines()]
    assert scaled_records(small_trace, 1) == original
    merged = scaled_records(small_trace, 3)
    assert len(merged) == 3 * len(original)
    stamps = [r["timestamp"] for r in merged]
    assert stamps == sorted(stamps)
    stride = max(max(r["hash_ids"]) for r in original) + 1
    copies = [sorted({h // stride for h in r["hash_ids"]}) for r in merged]
    assert all(len(c) == 1 for c in copies)  # no request mixes two copies' blocks
    gap = (original[-1]["timestamp"] - original[0]["timestamp"]) / (len(original) - 1)
    second = [r for r, c in zip(merged, copies, strict=True) if c == [1]]
    assert [r["timestamp"] - copy_shift_ms(1, 3, gap) for r in second] == stamps_of(original)
    out = write_scaled_trace(small_trace, 3, tmp_path / "x3.jsonl.gz")
    with gzip.open(out, "rt") as handle:
        assert [json.loads(line) for line in handle] == merged
    with pytest.raises(InvalidInputError, match="copies must be >= 1"):
        scaled_records(small_trace, 0)


def stamps_of(records: list[dict]) -> list[float]:
    return [r["timestamp"] for r in records]


def test_scaling_refuses_a_trace_that_is_not_mooncake(tmp_path) -> None:
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 5}) + "\n")
    with pytest.raises(InvalidInputError, match=r"other.jsonl:1: not a Mooncake record"):
        scaled_records(path, 2)


def test_hit_ratio_interval_brackets_the_ratio(prepared) -> None:
    spec = parse_policies("lru")[0]
    r = fleet_replay(prepared.workload, FleetCell("round-robin", spec, 2, SIZE))
    prompt = np.array(
        [
            c.num_prompt_tokens
            for c in prepared.workload.cache_requests[prepared.workload.first_counted :]
        ]
    )
    low, high = hit_ratio_interval(r.per_request, prompt)
    assert low < r.token_hit_ratio < high


def test_cli_prints_json_and_refuses_bad_flags_in_one_line(small_trace, tmp_path, capsys) -> None:
    from lpc.cli.main import main

    argv = ["fleet", "--trace", str(small_trace), "--policies", "lru", "--no-progress"]
    out = tmp_path / "f"
    assert (
        main([*argv, "--instances", "1,2", "--routers", "round-robin", "--json", "--out", str(out)])
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert [(c["instances"], c["router"]) for c in printed["cells"]] == [
        (1, "round-robin"),
        (2, "round-robin"),
    ]
    assert printed["cells"][0]["token_hit_ratio_ci95"] is not None
    for flags, message in [
        (["--routers", "random"], "--routers: unknown router 'random'"),
        (["--ray-address", "auto"], "--ray-address goes with --ray"),
        (["--policies", "belady", "--instances", "4"], "belady needs each instance's own future"),
    ]:
        assert main([*argv, *flags, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and message in err, err


def test_a_generated_workload_is_scaled_by_its_active_conversations() -> None:
    from lpc.fleet.pipeline import fleet_workload_for
    from lpc.workload import WorkloadConfig

    ab = ABOptions(workload=WorkloadConfig(max_active_conversations=50))
    assert fleet_workload_for(FleetOptions(ab), 4, print).workload.max_active_conversations == 200
    two = FleetOptions(ab, copies=2)
    assert fleet_workload_for(two, 4, print).workload.max_active_conversations == 100
