"""Traces: export → replay gives identical numbers; bad files fail with file:line messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpc.replay.ab import ReplayConstants, run_grid
from lpc.replay.policies import parse_policies
from lpc.replay.probability import OracleSource, TurnsSource
from lpc.replay.simulator import prepare
from lpc.traces.lpc_trace import TraceError, read_trace, write_trace
from lpc.workload import WorkloadConfig, open_loop_requests
from tests.lpc.synthetic import conversations


def results_for(requests):
    turns = [r.turn for r in requests]
    sources = {
        "oracle": OracleSource().predict(turns),
        "turns": TurnsSource.fit([1, 2, 3, 4, 5]).predict(turns),
    }
    workload = prepare(requests, 16, sources)
    specs = parse_policies("lru,lpc-turns,oracle,belady")
    return [
        (r.policy, r.cache_tokens, r.hit_tokens, r.queried_tokens, r.evictions)
        for r in run_grid(workload, specs, [6000, 20000], ReplayConstants(), workers=1)
    ]


def test_export_then_replay_gives_identical_numbers(tmp_path: Path) -> None:
    requests = open_loop_requests(
        conversations(200, seed=4), WorkloadConfig(duration_s=500, max_active_conversations=30)
    )
    path = tmp_path / "trace.jsonl"
    write_trace(path, requests, {"source": "synthetic"})
    trace = read_trace(path)
    assert trace.header["source"] == "synthetic"
    assert [r.request_id for r in trace.requests] == [r.request_id for r in requests]
    assert results_for(trace.requests) == results_for(requests)


def test_missing_labels_and_turns_are_derived_from_the_trace(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    lines = [
        {"conversation_id": "a", "arrival_s": 0, "completion_s": 1, "prompt_token_ids": [1, 2]},
        {"conversation_id": "b", "arrival_s": 0.5, "completion_s": 2, "prompt_token_ids": [3]},
        {
            "conversation_id": "a",
            "arrival_s": 5,
            "completion_s": 6,
            "prompt_token_ids": [1, 2, 4],
            "output_token_ids": [9],
            "probability": 0.7,
        },
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    trace = read_trace(path)
    turns = [(r.conversation_id, r.turn.turn_index, r.turn.has_next_turn) for r in trace.requests]
    assert turns == [("a", 0, True), ("b", 0, False), ("a", 1, False)]
    assert trace.logged_probabilities == [None, None, 0.7]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"log.jsonl:2: not valid JSON"),
        ("[1, 2]", r"log.jsonl:2: each line must be a JSON object"),
        ('{"arrival_s": 0, "completion_s": 1, "prompt_token_ids": [1]}', r":2: 'conversation_id'"),
        (
            '{"conversation_id": "x", "completion_s": 1, "prompt_token_ids": [1]}',
            r":2: 'arrival_s'",
        ),
        (
            '{"conversation_id": "x", "arrival_s": 2, "completion_s": 1, "prompt_token_ids": [1]}',
            "before arrival_s",
        ),
        (
            '{"conversation_id": "x", "arrival_s": 0, "completion_s": 1, "prompt_token_ids": [1, -2]}',
            r"prompt_token_ids\[1\] must be an int >= 0",
        ),
        (
            '{"conversation_id": "x", "arrival_s": 0, "completion_s": 1, "prompt_token_ids": [1.5]}',
            r"prompt_token_ids\[0\]",
        ),
        ('{"conversation_id": "x", "arrival_s": 0, "completion_s": 1}', "needs 'prompt_token_ids'"),
        (
            '{"conversation_id": "x", "arrival_s": 0, "completion_s": 1, "prompt_token_ids": []}',
            "the prompt is empty",
        ),
        (
            '{"conversation_id": "x", "arrival_s": "soon", "completion_s": 1, "prompt_token_ids": [1]}',
            "'arrival_s' must be a finite number",
        ),
        (
            '{"conversation_id": "x", "arrival_s": 0, "completion_s": 1, "prompt_token_ids": [1], '
            '"probability": 2}',
            "'probability' must be in",
        ),
        (
            '{"conversation_id": "x", "arrival_s": 0, "completion_s": 1, "messages": '
            '[{"role": "user", "content": "hi"}]}',
            "need a tokenizer",
        ),
        (
            '{"conversation_id": "a", "arrival_s": 0, "completion_s": 1, "prompt_token_ids": [1], '
            '"request_id": "dup"}',
            "appears twice",
        ),
    ],
)
def test_bad_lines_name_file_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "log.jsonl"
    good = '{"conversation_id": "a", "arrival_s": 0, "completion_s": 1, "prompt_token_ids": [1], "request_id": "dup"}'
    # A good line after the bad one: a bad last line could be a cut one, which is skipped.
    after = '{"conversation_id": "b", "arrival_s": 3, "completion_s": 4, "prompt_token_ids": [1]}'
    path.write_text(good + "\n" + line + "\n" + after + "\n")
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "absent.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TraceError, match="holds no requests"):
        read_trace(empty)
    future = tmp_path / "v9.jsonl"
    future.write_text('{"format": "lpc-trace", "version": 9}\n')
    with pytest.raises(TraceError, match="unsupported trace version 9"):
        read_trace(future)
