"""A request that completes at its own arrival time (completion_s == arrival_s, which the trace
format allows) is replayed like any other: it arrives, allocates, then frees. Times too large
for a float to tell milliseconds apart are refused when read, naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpc.cli.main import main
from lpc.replay.eviction_age import lru_eviction_ages
from lpc.replay.policies import parse_policies
from lpc.replay.simulator import prepare, replay
from lpc.workload import (
    ARRIVAL,
    COMPLETION,
    LatencyModel,
    WorkloadConfig,
    open_loop_requests,
)
from tests.lpc.synthetic import conversations
from tests.lpc.traces.helpers import mooncake_record, write_lines

PROMPT = list(range(1, 21))
# No test here reads a PNG: `lpc ab` writes placeholders for its plots (tests/lpc/conftest.py)
pytestmark = pytest.mark.usefixtures("no_plots")


def token_lines() -> list[dict]:
    """Issue 25's trace: the second turn completes at its arrival."""
    return [
        {
            "conversation_id": "a",
            "arrival_s": 0.0,
            "completion_s": 1.0,
            "prompt_token_ids": PROMPT,
            "output_token_ids": [5],
        },
        {
            "conversation_id": "a",
            "arrival_s": 10.0,
            "completion_s": 10.0,
            "prompt_token_ids": [*PROMPT, 5, 21, 22],
            "output_token_ids": [6],
        },
    ]


def request_log_lines() -> list[dict]:
    """The same in a request log's form (`sequence_hash_ids` over prompt and output)."""
    header = {"format": "lpc-trace", "version": 1, "hash_block_size": 16}
    first = {"input_length": 20, "output_length": 1, "sequence_hash_ids": [1, 2]}
    second = {"input_length": 23, "output_length": 1, "sequence_hash_ids": [1, 3]}
    return [
        header,
        {"conversation_id": "a", "arrival_s": 0.0, "completion_s": 1.0, **first},
        {"conversation_id": "a", "arrival_s": 10.0, "completion_s": 10.0, **second},
    ]


def small_chats(folder: Path) -> Path:
    """A few chats with 1 to 3 user turns: what `--split-at 0` fits lpc-turns on (the bundled
    ShareGPT, the default --dataset, takes seconds to load and tells these tests nothing)."""
    records = []
    for c in range(24):
        messages = []
        for t in range(1 + c % 3):
            messages += [
                {"role": "user", "content": f"question {t} of chat {c}"},
                {"role": "assistant", "content": f"answer {t}"},
            ]
        records.append({"id": f"chat{c}", "messages": messages})
    return write_lines(folder / "chats.jsonl", records)


def lpc_ab(trace: Path, out: Path, *args: str) -> int:
    if "--split-at" in args:  # no training part in the trace: the --dataset's half fits
        args = (*args, "--dataset", str(small_chats(trace.parent)))
    return main(
        [
            "ab",
            "--no-progress",
            "--workers",
            "1",
            "--trace",
            str(trace),
            "--policies",
            "lru,belady,lpc-turns,oracle",
            "--cache-sizes",
            "60000",
            "--out",
            str(out),
            "--json",
            *args,
        ]
    )


@pytest.mark.parametrize(
    ("lines", "args", "hit_ratio"),
    [
        # The second turn hits the first turn's one full block of 16 tokens (of its 23);
        # with the split at 0 the first turn's 20 prompt tokens count too.
        (token_lines, (), 16 / 23),
        (token_lines, ("--split-at", "0"), 16 / 43),
        (request_log_lines, (), 16 / 23),
    ],
    ids=["token-ids", "split-at-0", "request-log"],
)
def test_a_zero_duration_request_is_replayed(
    tmp_path: Path, capsys, lines, args: tuple[str, ...], hit_ratio: float
) -> None:
    trace = write_lines(tmp_path / "zero.jsonl", lines())
    assert lpc_ab(trace, tmp_path / "out", *args) == 0
    report = json.loads(capsys.readouterr().out)
    for policy in ("lru", "belady", "lpc-turns", "oracle"):
        assert list(report["comparison"]["hit_ratio"][policy].values()) == [
            pytest.approx(hit_ratio)
        ]


def test_its_completion_comes_right_after_its_own_arrival() -> None:
    # A latency far below the clock's resolution rounds every completion to its arrival.
    config = WorkloadConfig(
        duration_s=300,
        max_active_conversations=10,
        latency=LatencyModel(overhead_s=0.0, prefill_tokens_per_s=1e300, time_per_output_token_s=0),
    )
    requests = open_loop_requests(conversations(30, seed=2), config)
    assert all(r.completion_s == r.arrival_s for r in requests)
    workload = prepare(requests, 16, {})
    arrived: set[int] = set()
    for _, kind, i in workload.events:
        if kind == ARRIVAL:
            arrived.add(i)
        else:
            assert kind == COMPLETION and i in arrived
    for spec in parse_policies("lru,belady,fifo"):
        assert replay(workload, spec, 4000).requests == len(requests)
    assert lru_eviction_ages(workload, 4000).evictions >= 0


def test_events_of_a_trace_without_zero_durations_keep_their_order() -> None:
    requests = open_loop_requests(conversations(30, seed=3), WorkloadConfig(duration_s=300))
    events = prepare(requests, 16, {}).events
    expected = sorted(
        [(r.arrival_s, ARRIVAL, i) for i, r in enumerate(requests)]
        + [(r.completion_s, COMPLETION, i) for i, r in enumerate(requests)]
    )
    assert events == expected


@pytest.mark.parametrize(
    ("records", "message"),
    [
        (
            [mooncake_record(0, [1, 2]), mooncake_record(1e21, [1, 2])],
            "big.jsonl:2: 'timestamp' 1e+21 ms is too large for a time",
        ),
        (
            [{**token_lines()[0], "arrival_s": 1e15, "completion_s": 1e15 + 1}],
            "big.jsonl:1: 'arrival_s' 1e+15 s is too large for a time",
        ),
        (
            [
                {
                    "chat_id": 1,
                    "parent_chat_id": -1,
                    "timestamp": 1e13,
                    "input_length": 10,
                    "output_length": 1,
                    "type": "text",
                    "turn": 1,
                    "hash_ids": [7],
                }
            ],
            "big.jsonl:1: 'timestamp' 1e+13 s is too large for a time",
        ),
    ],
    ids=["mooncake-ms", "lpc-seconds", "bailian-seconds"],
)
def test_times_a_float_cannot_hold_to_the_millisecond_are_refused(
    tmp_path: Path, capsys, records: list[dict], message: str
) -> None:
    trace = write_lines(tmp_path / "big.jsonl", records)
    assert lpc_ab(trace, tmp_path / "out") == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_latency_flag_that_is_not_finite_is_one_line(tmp_path: Path, capsys, value) -> None:
    trace = write_lines(tmp_path / "t.jsonl", token_lines())
    assert lpc_ab(trace, tmp_path / "out", "--time-per-output-token", value) == 2
    err = capsys.readouterr().err.strip()
    assert "--time-per-output-token must be a finite number" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("lines", [token_lines()[:1], [token_lines()[0]] * 2], ids=["one", "same"])
def test_a_trace_spanning_no_time_has_no_training_part_but_at_split_0(
    tmp_path: Path, capsys, lines: list[dict]
) -> None:
    """One request, or every request at one time: the default split cuts at the first
    arrival and leaves nothing to fit the turns baseline on, so `lpc-turns` (named in
    --policies) is refused in one line pointing to `--split-at 0`, which replays it."""
    lines = [{**line, "request_id": f"r{i}"} for i, line in enumerate(lines)]
    trace = write_lines(tmp_path / "t.jsonl", lines)
    assert lpc_ab(trace, tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no training part to fit lpc-turns on; give --split-at 0" in err[0]
    assert lpc_ab(trace, tmp_path / "out", "--split-at", "0") == 0
