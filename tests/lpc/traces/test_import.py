"""Importing Mooncake, Bailian and the project's own traces: structure, labels, bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lpc.traces.jsonl import TraceError
from lpc.traces.load import TraceOptions, load_trace
from lpc.workload import LatencyModel
from tests.lpc.traces.helpers import bundled_lines, mooncake_record, write_lines

FAST = LatencyModel(overhead_s=0.0, prefill_tokens_per_s=1e9, time_per_output_token_s=0.0)


def options(**kw) -> TraceOptions:
    return TraceOptions(latency=kw.pop("latency", FAST), **kw)


# -- Mooncake ---------------------------------------------------------------------------


def test_mooncake_is_recognised_and_linked(tmp_path: Path) -> None:
    # Block 2 is the first prompt's partial last block; its continuation holds that block
    # in full, so under another id (5). Block 0 is a system block three chats share.
    records = [
        mooncake_record(0, [0, 1, 2]),
        mooncake_record(1500, [0, 1, 5, 6]),  # continues the first
        mooncake_record(2000, [0, 4]),
        mooncake_record(2500, [0, 7]),
    ]
    trace = load_trace(write_lines(tmp_path / "m.jsonl", records), options(shared_fanout=3))
    assert trace.format == "mooncake" and trace.trace_block_size == 512
    assert [r.arrival_s for r in trace.requests] == [0.0, 1.5, 2.0, 2.5]  # ms → seconds
    convs = [r.conversation_id for r in trace.requests]
    assert convs[0] == convs[1] and len(set(convs)) == 3
    assert [r.turn.turn_index for r in trace.requests] == [0, 1, 0, 0]
    assert trace.info["linkage"]["linked_requests"] == 1
    assert len(trace.requests[1].turn.token_ids) == 512 * 3 + 100 + 10


def test_gzip_and_plain_give_the_same_requests(tmp_path: Path) -> None:
    lines = bundled_lines()[:300]
    plain = load_trace(write_lines(tmp_path / "a.jsonl", lines), options())
    packed = load_trace(write_lines(tmp_path / "a.jsonl.gz", lines, compress=True), options())
    assert packed.info["compressed"] and not plain.info["compressed"]
    assert [(r.request_id, r.arrival_s, r.turn.token_ids) for r in plain.requests] == [
        (r.request_id, r.arrival_s, r.turn.token_ids) for r in packed.requests
    ]


def test_the_synthetic_mooncake_trace_imports_too() -> None:
    trace = load_trace("mooncake-synthetic", options())
    assert len(trace.requests) == 3993 and trace.format == "mooncake"
    assert trace.info["linkage"]["linked_requests"] > 0


@pytest.mark.parametrize("compress", [False, True])
def test_a_cut_last_line_is_skipped_and_counted(tmp_path: Path, compress: bool) -> None:
    lines = bundled_lines()[:20]
    cut = [*lines[:-1], lines[-1][: len(lines[-1]) // 2]]
    path = write_lines(tmp_path / "cut.jsonl", cut, compress=compress)
    trace = load_trace(path, options())
    assert len(trace.requests) == 19 and trace.info["skipped_last_lines"] == 1


def test_a_gzip_file_cut_short_keeps_what_came_before(tmp_path: Path) -> None:
    data = gzip.compress("\n".join(bundled_lines()[:200]).encode())
    path = tmp_path / "short.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    trace = load_trace(path, options())
    assert 0 < len(trace.requests) < 200


def test_lpc_traces_skip_a_cut_last_line_too(tmp_path: Path) -> None:
    good = {"conversation_id": "a", "arrival_s": 0, "completion_s": 1, "prompt_token_ids": [1]}
    path = write_lines(tmp_path / "t.jsonl", [good, '{"conversation_id": "b", "arr'])
    trace = load_trace(path, options())
    assert len(trace.requests) == 1 and trace.info["skipped_last_lines"] == 1


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([mooncake_record(5, [0]), mooncake_record(2, [0])], "m.jsonl:2: 'timestamp' 2 is before"),
        ([mooncake_record(-1, [0])], "m.jsonl:1: 'timestamp' must be >= 0"),
        (
            [{**mooncake_record(0, [0]), "hash_ids": []}],
            "m.jsonl:1: 'hash_ids' must be a non-empty",
        ),
        ([mooncake_record(0, [0, 1], input_length=2000)], "m.jsonl:1: 'input_length' 2000 needs 4"),
        ([{**mooncake_record(0, [0]), "hash_ids": [1, "x"]}], "hash_ids[1] must be an int"),
        ([{"time": 0, "prompt": "hi"}], "m.jsonl:1: unknown trace format (keys: prompt, time)"),
        (["[1, 2]", mooncake_record(0, [0])], "m.jsonl:1: each line must be a JSON object"),
        (["{broken", mooncake_record(0, [0])], "m.jsonl:1: not valid JSON"),
    ],
)
def test_bad_mooncake_input_names_file_line_and_field(
    tmp_path: Path, records: list, message: str
) -> None:
    with pytest.raises(TraceError) as error:
        load_trace(write_lines(tmp_path / "m.jsonl", records), options())
    assert message in str(error.value)


def test_a_non_gzip_file_with_the_gzip_magic_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl.gz"
    path.write_bytes(b"\x1f\x8b" + b"not gzip at all")
    with pytest.raises(TraceError, match="not a readable gzip file"):
        load_trace(path, options())


def test_missing_file_names_the_bundled_traces(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"no such trace file \(bundled traces: mooncake"):
        load_trace(tmp_path / "missing.jsonl", options())


# -- labels, cuts ------------------------------------------------------------------------


def test_horizon_labels_and_censoring(tmp_path: Path) -> None:
    # Chat A: turns at 0 s and 100 s; chat B at 10 s (never returns); chat C at 3000 s
    # (the last 30 minutes: censored).
    records = [
        mooncake_record(0, [0, 1, 2]),
        mooncake_record(10_000, [0, 7, 8]),
        mooncake_record(100_000, [0, 1, 5, 6]),
        mooncake_record(3_000_000, [0, 9]),
        mooncake_record(3_600_000, [0, 11]),
    ]
    linked = options(horizon_s=1800, shared_fanout=3)
    trace = load_trace(write_lines(tmp_path / "m.jsonl", records), linked)
    labels = [r.turn.has_next_turn for r in trace.requests]
    # A's first turn continues; A's last turn at 100 s ends (horizon within the trace);
    # B ends; C and the last request are censored and count as continuing.
    assert labels == [True, False, False, True, True]
    assert trace.info["censored_labels"] == 2
    short = load_trace(
        write_lines(tmp_path / "m.jsonl", records), options(horizon_s=50, shared_fanout=3)
    )
    assert short.requests[0].turn.has_next_turn is False  # 100 s later is beyond 50 s


def test_completion_times_come_from_the_latency_model(tmp_path: Path) -> None:
    latency = LatencyModel(overhead_s=0.5, prefill_tokens_per_s=1000.0, time_per_output_token_s=0.1)
    path = write_lines(tmp_path / "m.jsonl", [mooncake_record(0, [0, 1], 1000, 20)])
    (request,) = load_trace(path, options(latency=latency)).requests
    assert request.completion_s == pytest.approx(0.5 + 1.0 + 2.0)


def test_long_prompts_are_cut_to_max_model_len_and_counted(tmp_path: Path) -> None:
    long = mooncake_record(0, list(range(400)), input_length=512 * 399 + 7)  # ~204K tokens
    path = write_lines(tmp_path / "m.jsonl", [long, mooncake_record(1, [0, 1])])
    trace = load_trace(path, options(max_model_len=131072))
    assert trace.info["cut_to_max_model_len"] == 1
    tokens = trace.requests[0].turn.token_ids
    assert len(tokens) == 131072 and tokens.num_prompt_tokens == 131072
    assert len(tokens.block_ids) == 256


# -- Bailian -----------------------------------------------------------------------------


def bailian(chat, parent, t, turn, kind="text", blocks=2, **extra) -> dict:
    return {
        "chat_id": chat,
        "parent_chat_id": parent,
        "timestamp": t,
        "input_length": 16 * blocks - 3,
        "output_length": 5,
        "type": kind,
        "turn": turn,
        "hash_ids": [chat * 100 + i for i in range(blocks)],
        **extra,
    }


BAILIAN_FIXTURE = [
    # Out of order in the file: a child before its root, a grandchild first of all.
    bailian(13, 11, 1_700_000_030.0, 3, "file"),
    bailian(11, 10, 1_700_000_010.0, 2, "search"),
    bailian(10, -1, 1_700_000_000.0, 1, "text"),
    bailian(12, 10, 1_700_000_020.0, 2, "image"),  # a second child of 10: a branch
    bailian(20, -1, 1_700_000_005.0, 1, "text"),
    bailian(30, 999, 1_700_000_040.0, 4, "search"),  # parent not in the trace: an orphan
]
# SipHash values as the release writes them: 64-bit, some printed as signed integers.
BAILIAN_FIXTURE[4]["hash_ids"] = [-6_917_529_027_641_081_856, 18_446_744_073_709_551_615]


def test_bailian_structure_follows_its_ids(tmp_path: Path) -> None:
    trace = load_trace(write_lines(tmp_path / "b.jsonl", BAILIAN_FIXTURE), options())
    assert trace.format == "bailian" and trace.trace_block_size == 16
    by_id = {r.request_id: r for r in trace.requests}
    assert [r.request_id for r in trace.requests] == ["10", "20", "11", "12", "13", "30"]
    assert {k: by_id[k].conversation_id for k in by_id} == {
        "10": "10",
        "11": "10",
        "12": "10",
        "13": "10",
        "20": "20",
        "30": "30",
    }
    assert {k: by_id[k].turn.turn_index for k in by_id} == {
        "10": 0,
        "11": 1,
        "12": 1,
        "13": 2,
        "20": 0,
        "30": 3,
    }
    assert by_id["10"].arrival_s == 0.0 and by_id["13"].arrival_s == 30.0  # epoch → from 0
    assert trace.info["orphans"] == 1
    assert trace.info["types"] == {"file": 1, "search": 2, "text": 2, "image": 1}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"type": "video"}, "'type' must be one of text, search, image, file"),
        ({"chat_id": 10}, "'chat_id' 10 already appeared on line"),
        ({"timestamp": 1_600_000_000.0}, "is before its parent 11"),
        ({"turn": 0}, "'turn' must be an int >= 1"),
        ({"hash_ids": [1]}, "'input_length' 29 needs 2 blocks of 16 tokens"),
        ({"parent_chat_id": 13}, "'parent_chat_id' 13 is the request itself"),
    ],
)
def test_bad_bailian_lines_name_their_line(tmp_path: Path, change: dict, message: str) -> None:
    records = [dict(r) for r in BAILIAN_FIXTURE]
    records[0].update(change)  # line 1
    with pytest.raises(TraceError) as error:
        load_trace(write_lines(tmp_path / "b.jsonl", records), options())
    assert "b.jsonl:1:" in str(error.value) or "b.jsonl:" in str(error.value)
    assert message in str(error.value)


def test_an_explicit_format_overrides_recognition(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "b.jsonl", BAILIAN_FIXTURE)
    with pytest.raises(TraceError, match="'input_length' 29 needs 1 blocks of 512 tokens"):
        load_trace(path, options(format="mooncake"))


@pytest.mark.slow  # the whole trace (the default suite loads slices of it)
def test_bundled_trace_loads_whole() -> None:
    trace = load_trace("mooncake", options())
    assert len(trace.requests) == 12031
    assert sum(r.turn.num_prompt_tokens for r in trace.requests) == 144_793_823
    assert json.loads(bundled_lines()[0])["hash_ids"][0] == 0


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            [
                {"format": "lpc-trace", "version": 1, "hash_block_size": 0},
                {"conversation_id": "a", "arrival_s": 0, "completion_s": 1, "hash_ids": [1]},
            ],
            "header 'hash_block_size' must be an int >= 1, got 0",
        ),
        (
            [
                {"format": "lpc-trace", "version": 1},
                {"conversation_id": "a", "arrival_s": 0, "completion_s": 1, "hash_ids": [1]},
                {"conversation_id": "a", "arrival_s": 1, "completion_s": 2, "hash_ids": [1]},
            ],
            "t.jsonl:2: 'hash_ids' needs 'hash_block_size' in the header line",
        ),
        (
            [
                {"format": "lpc-trace", "version": 1, "hash_block_size": 16},
                {
                    "conversation_id": "a",
                    "arrival_s": 0,
                    "completion_s": 1,
                    "prompt_token_ids": [1],
                },
                {
                    "conversation_id": "a",
                    "arrival_s": 1,
                    "completion_s": 2,
                    "prompt_token_ids": [1],
                },
            ],
            "t.jsonl:2: a trace with 'hash_block_size' needs 'hash_ids' or 'sequence_hash_ids' on every line",
        ),
    ],
)
def test_bad_block_hash_form_lines(tmp_path: Path, lines: list, message: str) -> None:
    with pytest.raises(TraceError) as error:
        load_trace(write_lines(tmp_path / "t.jsonl", lines), options())
    assert message in str(error.value)
