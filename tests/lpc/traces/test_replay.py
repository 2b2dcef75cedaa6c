"""Replaying traces: the infinite-cache hit ratio matches the hash ids, the evaluation part is
what is counted, and an exported trace replays to identical numbers (the policies' order on
the slice is tests/golden's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpc.replay.ab_options import ABOptions
from lpc.replay.ab_run import run_ab
from lpc.replay.policies import parse_policies, parse_policy
from lpc.replay.simulator import prepare, replay
from lpc.traces.load import TraceOptions, load_trace
from tests.lpc.plots import plots_skipped
from tests.lpc.traces.helpers import bundled_lines, direct_infinite_hit_ratio, write_lines

POLICIES = "lru,fifo,lpc-turns,lpc-const,oracle,belady"
SLICE_REQUESTS = 500
RUN_REQUESTS = 250  # the ab runs below: replayed, exported, replayed again
# No test here reads a PNG: `lpc ab` writes placeholders for its plots (tests/lpc/conftest.py)
pytestmark = pytest.mark.usefixtures("no_plots")


def infinite_cache_hit_ratio(spec: str | Path, block_size: int) -> float:
    requests = load_trace(spec, TraceOptions()).requests
    workload = prepare(requests, block_size, {})
    total = sum(len(r.turn.token_ids) for r in requests)
    return replay(workload, parse_policy("lru"), total + block_size).token_hit_ratio


def test_infinite_cache_matches_the_hash_ids_at_block_size_512_on_a_slice(tmp_path: Path) -> None:
    # (the whole trace: the slow test below; 500 requests already hit 16 % of their tokens)
    lines = bundled_lines()[:SLICE_REQUESTS]
    direct = direct_infinite_hit_ratio([json.loads(line) for line in lines])
    path = write_lines(tmp_path / "slice.jsonl", lines)
    assert abs(infinite_cache_hit_ratio(path, 512) - direct) < 0.001


@pytest.mark.slow
def test_infinite_cache_matches_the_hash_ids_at_block_size_512() -> None:
    direct = direct_infinite_hit_ratio([json.loads(line) for line in bundled_lines()])
    assert abs(infinite_cache_hit_ratio("mooncake", 512) - direct) < 0.001


def test_infinite_cache_matches_the_hash_ids_at_block_size_16_on_a_slice(tmp_path: Path) -> None:
    lines = bundled_lines()[:75]  # 0.95M tokens, 4 % of them hit
    direct = direct_infinite_hit_ratio([json.loads(line) for line in lines])
    path = write_lines(tmp_path / "slice.jsonl", lines)
    assert abs(infinite_cache_hit_ratio(path, 16) - direct) < 0.005


@pytest.mark.slow
def test_infinite_cache_matches_the_hash_ids_at_block_size_16() -> None:
    direct = direct_infinite_hit_ratio([json.loads(line) for line in bundled_lines()])
    assert abs(infinite_cache_hit_ratio("mooncake", 16) - direct) < 0.005


@pytest.fixture(scope="module")
def slice_run(tmp_path_factory) -> tuple[dict, dict, Path]:
    """The first 250 requests of the bundled trace, replayed, exported, replayed again, at one
    cache size where the policies part ways. Every policy's hits on the first 500 at three sizes,
    Belady's bound, LRU's growth with the cache and LPC with a constant p being LRU are checked
    by tests/golden (`test_hit_tokens_match_the_pinned_values[mooncake]`,
    `test_the_pinned_values_keep_the_policies_in_order`)."""
    root = tmp_path_factory.mktemp("mooncake")
    path = write_lines(root / "slice.jsonl", bundled_lines()[:RUN_REQUESTS])
    exported = root / "export.jsonl"
    common = dict(
        policies=tuple(parse_policies(POLICIES)),
        cache_sizes_tokens=(2_000_000,),
        workers=1,
        progress=False,
    )
    with plots_skipped():  # a module fixture: set up before `no_plots`
        first = run_ab(
            ABOptions(trace=path, export_trace=exported, out_dir=root / "a", **common),
            log=lambda _: None,
        )
        again = run_ab(ABOptions(trace=exported, out_dir=root / "b", **common), log=lambda _: None)
    return first.to_json(), again.to_json(), exported


def hits(outcome: dict) -> dict[tuple[str, int], tuple[int, int, int]]:
    return {
        (r["policy"], r["cache_tokens"]): (r["hit_tokens"], r["queried_tokens"], r["evictions"])
        for r in outcome["results"]
    }


def test_the_evaluation_half_is_counted(slice_run) -> None:
    summary = slice_run[0]["workload"]
    split = summary["trace"]["split"]
    assert split["train_requests"] + split["eval_requests"] == RUN_REQUESTS
    assert summary["requests"] == split["eval_requests"] > 0
    queried = {r["queried_tokens"] for r in slice_run[0]["results"]}
    assert queried == {summary["prompt_tokens"]}


def test_an_exported_trace_replays_to_identical_numbers(slice_run) -> None:
    first, again, exported = slice_run
    assert hits(first) == hits(again)
    header = json.loads(exported.read_text().split("\n", 1)[0])
    assert header["format"] == "lpc-trace" and header["hash_block_size"] == 512
    assert again["workload"]["trace"]["format"] == "lpc"


def test_epoch_timestamps_report_the_real_span(tmp_path: Path) -> None:
    lines = [
        {
            "conversation_id": "a",
            "arrival_s": 1_700_000_000 + 10 * i,
            "completion_s": 1_700_000_001 + 10 * i,
            "prompt_token_ids": list(range(40 + 20 * i)),
        }
        for i in range(6)
    ]
    path = write_lines(tmp_path / "epoch.jsonl", lines)
    outcome = run_ab(
        ABOptions(
            trace=path,
            policies=tuple(parse_policies("lru,oracle")),
            cache_sizes_tokens=(512,),
            split_at=0.3,
            fallback_probability=0.5,
            workers=1,
            progress=False,
            out_dir=tmp_path / "o",
        ),
        log=lambda _: None,
    )
    assert outcome.workload_summary["span_s"] == pytest.approx(51.0)
    assert outcome.workload_summary["trace"]["split"]["cut_after_start_s"] == pytest.approx(15.0)


def test_a_bailian_trace_replays_end_to_end(tmp_path: Path) -> None:
    from tests.lpc.traces.test_import import BAILIAN_FIXTURE

    path = write_lines(tmp_path / "b.jsonl", BAILIAN_FIXTURE)
    outcome = run_ab(
        ABOptions(
            trace=path,
            policies=tuple(parse_policies("lru,lpc-turns,oracle,belady")),
            cache_sizes_tokens=(256, 4096),
            workers=1,
            progress=False,
            out_dir=tmp_path / "o",
        ),
        log=lambda _: None,
    )
    summary = outcome.workload_summary
    assert summary["block_size"] == 16 and summary["trace"]["format"] == "bailian"
    assert summary["trace"]["split"] == {
        "cut_s": 20.0,
        "cut_after_start_s": 20.0,
        "train_requests": 3,
        "eval_requests": 3,
    }
    assert "Conversations from chat ids" in (tmp_path / "o" / "report.md").read_text()


def test_the_learned_predictor_is_refused_on_a_trace_without_text(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "slice.jsonl", bundled_lines()[:20])
    options = ABOptions(trace=path, policies=tuple(parse_policies("lru,lpc")), progress=False)
    with pytest.raises(ValueError, match="a mooncake trace has no text"):
        run_ab(options, log=lambda _: None)
