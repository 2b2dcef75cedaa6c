"""The differential-test machinery without vLLM: stream generator, record format, our replay.

The vLLM suite (tests/vllm, marked `vllm`) only proves something if its streams exercise what
can differ; these fast tests pin down that the streams do (shared prefixes, multi-turn
extensions, resends, salts, unaligned lengths, out-of-order frees, evictions and failures), and
that our manager, replayed on them, keeps its invariants and never leaks a prefix across salts.
"""

from __future__ import annotations

import io

import pytest
from hypothesis import given

from lpc.difftest.checks import (
    check_salt_isolation,
    frees_out_of_order,
    replay_totals,
)
from lpc.difftest.ops import (
    FreeRequest,
    NewRequest,
    StepRecord,
    Stream,
    StreamStart,
    first_difference,
    read_streams,
    streams_to_jsonl,
)
from lpc.difftest.replay import replay_stream
from lpc.difftest.streams import StreamParams, generate_stream, params_for_seed
from tests.properties import SEEDS, examples, exercised

# Pools small enough (of the 40 to 96 blocks `params_for_seed` draws) that allocations fail.
SMALL_POOL_SEEDS = SEEDS.filter(lambda seed: params_for_seed(seed).num_blocks <= 60)


def test_streams_are_deterministic_per_seed() -> None:
    three = streams_to_jsonl([generate_stream(3)])
    assert three == streams_to_jsonl([generate_stream(3)])
    assert three != streams_to_jsonl([generate_stream(4)])
    assert params_for_seed(5) == params_for_seed(5)


def test_streams_round_trip_through_json_lines() -> None:
    streams = [generate_stream(1, StreamParams(steps=300)), generate_stream(2)]
    text = streams_to_jsonl(streams)
    back = list(read_streams(io.StringIO(text)))
    assert [s.config for s in back] == [s.config for s in streams]
    assert [s.ops for s in back] == [s.ops for s in streams]


def test_step_records_round_trip_and_name_the_first_difference() -> None:
    record = StepRecord("s", 4, "new", "r1", 8, (1, 2, 6), (6,), None, (3, 4), (1, 2, 6))
    assert StepRecord.from_json(record.to_json()) == record
    failed = StepRecord("s", 5, "new", "r2", 4, None, (), None, (3, 4), (1, 2, 6))
    assert failed.failed and StepRecord.from_json(failed.to_json()) == failed
    other = StepRecord("s", 4, "new", "r1", 8, (1, 2, 6), (), None, (4, 3), (1, 2, 6))
    assert first_difference(record, other) == "evicted"
    assert first_difference(record, record) is None


@pytest.mark.parametrize(
    "line",
    [
        '{"op": "new", "id": "r1", "prompt": [1, 2]}',  # before any config
        '{"op": "config", "stream": "s", "num_blocks": 8, "block_size": 4}\n{"op": "jump"}',
        '{"op": "config", "stream": "s", "num_blocks": 8, "block_size": 4}\n'
        '{"op": "new", "id": "r1", "prompt": [1, -2]}',
        '{"op": "config", "stream": "s", "num_blocks": 8, "block_size": 4}\n'
        '{"op": "new", "id": "r1", "prompt": [1, true]}',
        "not json",
    ],
)
def test_bad_streams_are_rejected_with_the_line_number(line: str) -> None:
    with pytest.raises(ValueError, match="line"):
        list(read_streams(io.StringIO(line)))


@examples(20)
@given(seed=SEEDS)
def test_streams_exercise_what_can_differ(seed: int) -> None:
    """Every seed's stream, not only the vLLM suite's (`LPC_VLLM_DIFF_SEEDS`, 0 to 19 by
    default): a property of the generator."""
    stream = generate_stream(seed)
    bs = stream.config.block_size
    news = [op for op in stream.ops if isinstance(op, NewRequest)]
    assert len(stream.ops) == 2000
    assert len(news) > 800 and any(isinstance(op, FreeRequest) for op in stream.ops)
    assert all(op.num_tokens <= (stream.config.num_blocks - 1) * bs for op in news)
    # Lengths off and on the block grid (aligned prompts hit the "recompute one token" cap).
    assert sum(len(op.prompt) % bs != 0 for op in news) > len(news) // 2
    assert sum(len(op.prompt) % bs == 0 for op in news) > 0
    # Multi-turn chat: a prompt is an earlier request's prompt + output + a new message.
    sequences: set[tuple[str | None, tuple[int, ...]]] = set()
    seen_requests: set[tuple[str | None, tuple[int, ...], tuple[int, ...]]] = set()
    extensions = resends = 0
    for op in news:
        key = (op.cache_salt, op.prompt, op.output)
        resends += key in seen_requests
        seen_requests.add(key)
        extensions += any(
            (op.cache_salt, op.prompt[:n]) in sequences for n in range(len(op.prompt) - 1, 0, -1)
        )
        sequences.add((op.cache_salt, op.prompt + op.output))
    assert extensions > len(news) // 3
    assert resends > 5  # identical requests: duplicate cached blocks in both implementations
    salts = {op.cache_salt for op in news}
    assert None in salts and len(salts) >= 3
    assert frees_out_of_order(stream) > 100


@examples(2)
@given(seed=SMALL_POOL_SEEDS)
def test_our_replay_keeps_invariants_isolates_salts_and_is_not_trivial(seed: int) -> None:
    stream = generate_stream(seed)
    records = list(replay_stream(stream, observe=lambda manager, _: manager.check_invariants()))
    assert len(records) == len(stream.ops) + 1
    totals = replay_totals(stream, records)
    assert totals.hit_requests > 300 and totals.evictions > 1000
    report = check_salt_isolation(stream, records)
    assert report.violations == ()
    assert report.cross_salt_opportunities > 10 and report.salted_hits > 50
    exercised("failed allocations", totals.failures, 10)  # most small pools fail some


def test_salt_isolation_check_catches_a_leak() -> None:
    """The oracle must fail when a hit crosses salts, or it would prove nothing."""
    prompt = tuple(range(9))
    stream = Stream(
        StreamStart("leak", 16, 4),
        [NewRequest("a", prompt, (), "tenant-a"), NewRequest("b", prompt, (), "tenant-b")],
    )
    config = StepRecord("leak", 0, "config", None, None, None, (), None, (), ())
    a = StepRecord("leak", 1, "new", "a", 0, (1, 2, 3), (), None, (), (1, 2))
    leaked = StepRecord("leak", 2, "new", "b", 8, (1, 2, 4), (), None, (), (1, 2))
    report = check_salt_isolation(stream, [config, a, leaked])
    assert len(report.violations) == 1 and "tenant-b" in report.violations[0]
    isolated = StepRecord("leak", 2, "new", "b", 0, (4, 5, 6), (), None, (), (1, 2, 4, 5))
    clean = check_salt_isolation(stream, [config, a, isolated])
    assert clean.violations == () and clean.cross_salt_opportunities == 1
