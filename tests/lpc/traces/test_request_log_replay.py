"""A request log is a faithful trace: replaying the log a run wrote gives that run's hits.

The run is a replay through our own block manager that logs each finished request as the
serving plugin does (engine block hashes, hits, probability); the log is then read back as a
folder of `lpc` trace files and replayed again.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from lpc.cli.main import main
from lpc.integrations.request_log import RequestLogConfig, RequestLogWriter
from lpc.replay.policies import parse_policy
from lpc.replay.simulator import prepare, replay
from lpc.traces.load import TraceOptions, load_trace
from lpc.workload import WorkloadRequest
from tests.lpc.synthetic import conversations

CACHE_TOKENS = 4_000  # well below the workload's ~115K prompt tokens: LRU evicts a lot
# No test here reads a PNG: `lpc ab` writes placeholders for its plots (tests/lpc/conftest.py)
pytestmark = pytest.mark.usefixtures("no_plots")


def chat_requests(count: int = 60, seed: int = 1) -> list[WorkloadRequest]:
    """Conversations whose next prompt repeats the previous prompt and reply, with think
    times, interleaved over ten minutes."""
    rng = random.Random(seed)
    out = []
    for conversation in conversations(count, seed):
        t = rng.uniform(0, 600)
        for turn in conversation:
            done = t + rng.uniform(0.5, 5)
            out.append(WorkloadRequest(f"{turn.conversation_id}#{turn.turn_index}", turn, t, done))
            t = done + rng.expovariate(1 / 30)
    out.sort(key=lambda r: r.arrival_s)
    return out


def logged_run(directory: Path, policy: str, strip_conversations: bool = False):
    requests = chat_requests()
    probabilities = [random.Random(i).random() for i in range(len(requests))]
    workload = prepare(requests, 16, {"trace": probabilities})
    writer = RequestLogWriter(RequestLogConfig(directory, salt="test"))
    sink = writer
    if strip_conversations:

        class Anonymous:  # a client that sends no conversation ids
            def append(self, record):
                return writer.append(
                    dataclasses.replace(record, conversation_id=None, turn_index=None)
                )

        sink = Anonymous()
    result = replay(workload, parse_policy(policy), CACHE_TOKENS, request_log=sink)
    writer.close()
    assert writer.counters.snapshot()["records_written"] == len(requests)
    return result


@pytest.mark.parametrize("policy", ["lru", "lpc-trace"])
def test_replaying_the_log_gives_the_run_s_hit_ratio(tmp_path: Path, policy: str) -> None:
    first = logged_run(tmp_path, policy)
    assert 0.2 < first.token_hit_ratio < 0.6 and first.evictions > 0
    trace = load_trace(tmp_path, TraceOptions())
    assert trace.info["request_log"]["engine_token_hit_ratio"] == first.token_hit_ratio
    logged = trace.logged_probabilities
    assert (logged is None) == (policy == "lru")  # LRU uses no probability
    workload = prepare(trace.requests, trace.trace_block_size, {"trace": logged} if logged else {})
    again = replay(workload, parse_policy(policy), CACHE_TOKENS)
    assert again.hit_tokens == first.hit_tokens
    assert again.queried_tokens == first.queried_tokens
    assert again.evictions == first.evictions


def test_conversations_are_inferred_when_the_client_sends_none(tmp_path: Path) -> None:
    first = logged_run(tmp_path, "lru", strip_conversations=True)
    trace = load_trace(tmp_path, TraceOptions())
    conversations_found = {r.turn.conversation_id for r in trace.requests}
    truth = {r.turn.conversation_id for r in chat_requests()}
    # Prefix linkage: a later turn continues the earlier one whose prompt and reply it
    # repeats. Conversations sharing the system prompt are kept apart (a shared block).
    assert abs(len(conversations_found) - len(truth)) <= len(truth) // 10
    assert max(r.turn.turn_index for r in trace.requests) >= 3
    workload = prepare(trace.requests, 16, {})
    assert replay(workload, parse_policy("lru"), CACHE_TOKENS).hit_tokens == first.hit_tokens


def test_lpc_ab_replays_a_log_folder(tmp_path: Path, capsys) -> None:
    logs = tmp_path / "logs"
    first = logged_run(logs, "lpc-trace")
    code = main(
        [
            "ab",
            "--no-progress",
            "--workers",
            "1",
            "--trace",
            str(logs),
            "--split-at",
            "0",
            "--policies",
            "lru,lpc-trace",
            "--cache-sizes",
            str(CACHE_TOKENS),
            "--scale",
            "0.01",  # the run's LPC decay scale (replay's default)
            # the run's fallback p (replay's default); without it the fallback is fitted on
            # the bundled ShareGPT, seconds of loading that no logged request needs
            "--fallback-p",
            "0.5",
            "--out",
            str(tmp_path / "out"),
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    engine = report["workload"]["trace"]["request_log"]
    assert engine["engine_token_hit_ratio"] == pytest.approx(first.token_hit_ratio, abs=0)
    replayed = report["comparison"]["hit_ratio"]["lpc-trace"]
    assert list(replayed.values()) == [pytest.approx(first.token_hit_ratio, abs=1e-12)]


def test_a_bad_log_folder_is_one_clear_error(tmp_path: Path) -> None:
    from lpc.traces.jsonl import TraceError
    from lpc.traces.lpc_trace import read_trace

    with pytest.raises(TraceError, match=r"the folder holds no \.jsonl or \.jsonl\.gz trace files"):
        read_trace(tmp_path)
    line = {"input_length": 20, "output_length": 0, "sequence_hash_ids": [1, 2]}
    for name, block_size in (("a.jsonl", 16), ("b.jsonl", 32)):
        header = {"format": "lpc-trace", "version": 1, "hash_block_size": block_size}
        rows = [header, {**line, "arrival_s": 1, "completion_s": 2, "request_id": name}]
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TraceError, match=r"b.jsonl:1: 'hash_block_size' 32 differs from 16"):
        read_trace(tmp_path)
