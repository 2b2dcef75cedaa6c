"""The evictor benchmark's plumbing: enough operations, faithful call files, fair replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpc.benchmarks.evictor_bench import record_at_least
from lpc.benchmarks.evictor_ops import PUSH, REMOVE, count_block_ops, read_calls, write_calls
from lpc.benchmarks.evictor_worker import Replayer, main


def test_the_plan_grows_until_every_policy_gets_the_operations_asked_for() -> None:
    # (seed 1 at this size grows the plan twice, as it did at 30,000 operations on 2,000 blocks)
    _, recorded = record_at_least(10_000, 700, seed=1)
    counts = {name: count_block_ops(calls) for name, calls in recorded.items()}
    assert set(counts) == {"lru", "lpc"}
    assert min(counts.values()) >= 10_000


def test_call_files_round_trip(tmp_path: Path) -> None:
    _, recorded = record_at_least(5_000, 500, seed=2)
    path = tmp_path / "calls.json"
    write_calls(path, 500, recorded["lpc"])
    num_blocks, calls = read_calls(path)
    assert num_blocks == 500
    assert calls == [
        (kind, list(arg) if kind == PUSH else arg, tuple(meta) if kind == PUSH else None)
        for kind, arg, meta in recorded["lpc"]
    ]


@pytest.mark.parametrize(
    "content", ["not json", '{"calls": []}', '{"num_blocks": 4, "calls": [[7, 1, null]]}']
)
def test_a_bad_call_file_names_itself(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"bad\.json: not a recorded call file"):
        read_calls(path)


@pytest.mark.parametrize("policy", ["lru", "lpc"])
def test_replayed_ids_are_the_evictors_own_objects(tmp_path: Path, policy: str) -> None:
    _, recorded = record_at_least(5_000, 500, seed=3)
    path = tmp_path / "calls.json"
    write_calls(path, 500, recorded[policy])
    replayer = Replayer(policy, *read_calls(path))
    pop_n, _, _ = replayer.fresh()
    own = {id(block_id) for block_id in pop_n(500)}
    replayer.fresh()
    for kind, arg, _ in replayer.calls:
        ids = arg if kind == PUSH else [arg] if kind == REMOVE else []
        assert {id(block_id) for block_id in ids} <= own  # type: ignore[union-attr]


def test_a_replay_runs_the_recording_again_after_every_reset(tmp_path: Path) -> None:
    """The prepared calls drive the evictor through the recorded run, every pop valid,
    and a reset makes the next replay pop exactly the same blocks."""
    _, recorded = record_at_least(5_000, 500, seed=4)
    for policy, calls in recorded.items():
        path = tmp_path / f"{policy}.json"
        write_calls(path, 500, calls)
        replayer = Replayer(policy, *read_calls(path))
        replays = []
        for _ in range(2):
            pop_n, remove, push = replayer.fresh()
            popped = []
            for kind, arg, prepared in replayer.calls:
                if kind == PUSH:
                    push(*prepared)  # type: ignore[misc]
                elif kind == REMOVE:
                    remove(arg)
                else:
                    popped.append(pop_n(arg))
                    assert len(popped[-1]) == arg
            evictor = replayer.evictor
            assert len(evictor) == len(evictor.free_block_ids())
            replays.append(popped)
        assert replays[0] == replays[1]


def test_the_worker_prints_one_timing_record(tmp_path: Path, capsys) -> None:
    _, recorded = record_at_least(3_000, 400, seed=5)
    path = tmp_path / "lpc.json"
    write_calls(path, 400, recorded["lpc"])
    main(["--policy", "lpc", "--calls", str(path), "--repeats", "1"])
    timing = json.loads(capsys.readouterr().out)
    assert timing["block_ops"] == count_block_ops(recorded["lpc"])
    # Both are timed (their order is the machine's: the report clamps a negative difference).
    assert timing["seconds"] > 0 and timing["loop_seconds"] > 0


def test_a_vanished_time_gives_no_ratio_instead_of_dividing_by_zero() -> None:
    from lpc.benchmarks.evictor_bench import _ratios

    assert _ratios({"lru": 0.0, "lpc": 5.0}) == {"lpc_over_lru": None}
    assert _ratios({"lru": 2.0, "lpc": 5.0}) == {"lpc_over_lru": 2.5}
