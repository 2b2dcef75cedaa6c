"""`lpc ab` from the command line: runs, round-trips a trace, and rejects bad input clearly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lpc.cli.main import main

ACCESS_MODEL = Path(__file__).resolve().parents[2] / "models" / "mooncake-access"  # a classifier
WORDS = [
    "cache",
    "block",
    "prefix",
    "token",
    "user",
    "reply",
    "think",
    "pause",
    "model",
    "serve",
    "evict",
    "heap",
]


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> Path:
    """A small OpenAI-messages data set with multi-turn chats of varied length."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    with path.open("w") as handle:
        for c in range(400):
            messages = []
            for _ in range(rng.randint(1, 6)):
                messages.append(
                    {
                        "role": "user",
                        "content": " ".join(rng.choices(WORDS, k=rng.randint(20, 200))),
                    }
                )
                messages.append(
                    {
                        "role": "assistant",
                        "content": " ".join(rng.choices(WORDS, k=rng.randint(20, 300))),
                    }
                )
            handle.write(json.dumps({"id": f"chat{c}", "messages": messages}) + "\n")
    return path


def run_json(args: list[str], capsys) -> dict:
    """`lpc ab ARGS --json` in one process (tests/lpc/test_ab.py compares parallel replays
    with serial ones)."""
    assert main([*args, "--json", "--no-progress", "--workers", "1"]) == 0
    return json.loads(capsys.readouterr().out)


def test_generated_run_writes_every_report(chats: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    result = run_json(
        [
            "ab",
            "--dataset",
            str(chats),
            "--duration",
            "600",
            "--max-active",
            "30",
            "--cache-sizes",
            "3000,6000,12000",
            "--policies",
            "lru,lpc-turns,lpc-const,oracle,belady",
            "--think-time-sweep",
            "50,100",
            "--sweep-cache-size",
            "6000",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert result["workload"]["requests"] > 50
    hit = result["comparison"]["hit_ratio"]
    assert hit["lru"]["3000"] <= hit["lru"]["6000"] <= hit["lru"]["12000"]
    for size in ("3000", "6000", "12000"):
        assert hit["belady"][size] >= max(v[size] for v in hit.values()) - 1e-12
        assert abs(hit["lpc-const"][size] - hit["lru"][size]) < 0.005
    for name in (
        "results.csv",
        "report.md",
        "results.json",
        "hit_ratio_vs_cache_size.png",
        "think_time_sweep.csv",
        "hit_ratio_vs_think_time.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert "Share of the LRU→oracle gap closed" in (out / "report.md").read_text()


@pytest.mark.usefixtures("no_plots")
def test_exported_trace_replays_to_identical_numbers(chats: Path, tmp_path: Path, capsys) -> None:
    trace = tmp_path / "trace.jsonl"
    common = ["--cache-sizes", "3000,9000", "--policies", "lru,lpc-turns,oracle,belady"]
    generated = run_json(
        [
            "ab",
            "--dataset",
            str(chats),
            "--duration",
            "500",
            "--max-active",
            "20",
            "--export-trace",
            str(trace),
            "--trace-probabilities",
            "turns",
            "--out",
            str(tmp_path / "a"),
            *common,
        ],
        capsys,
    )
    replayed = run_json(
        [
            "ab",
            "--trace",
            str(trace),
            "--split-at",
            "0",  # count every request, fit lpc-turns on the data set as the generated run did
            "--dataset",
            str(chats),
            "--out",
            str(tmp_path / "b"),
            *common[:2],
            "--policies",
            "lru,lpc-turns,lpc-trace,oracle,belady",
        ],
        capsys,
    )
    strip = lambda results: {(r["policy"], r["cache_tokens"]): r["hit_tokens"] for r in results}  # noqa: E731
    a, b = strip(generated["results"]), strip(replayed["results"])
    assert all(a[key] == b[key] for key in a)
    # The trace carries the turns source's predictions: replaying them gives the same hits.
    for size in (3000, 9000):
        assert b[("lpc-trace", size)] == b[("lpc-turns", size)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "lru,mru"], "unknown policy 'mru'"),
        (["--duration", "soon"], "--duration"),
        (["--fallback-p", "2"], "--fallback-p must be in"),
        (["--trace-probabilities", "oracle"], "goes with --export-trace"),
        (["--closed-loop"], "belady needs a fixed trace"),
        (["--policies", "lru,lpc", "--model", "none"], "needs a trained predictor model"),
        (
            ["--policies", "lru,lpc-return-model", "--return-model", str(ACCESS_MODEL)],
            "not a return-time model",
        ),
    ],
)
def test_bad_flags_give_one_clear_line(chats: Path, tmp_path: Path, capsys, args, message) -> None:
    code = main(["ab", "--dataset", str(chats), "--out", str(tmp_path), "--no-progress", *args])
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cache-sizes", "0"], "cache sizes must be > 0"),
        (["--cache-sizes", "60K:10K:5K"], "below its start"),
        (["--think-time", "-3"], "must be a finite number > 0"),
        (["--block-size", "x"], "is not an integer"),
    ],
)
def test_bad_values_are_rejected_by_the_parser(capsys, args, message) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["ab", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_broken_trace_names_its_line(tmp_path: Path, chats: Path, capsys) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(
        '{"conversation_id": "a", "arrival_s": 0, "completion_s": 1, "prompt_token_ids": [1]}\n{oops\n'
        '{"conversation_id": "b", "arrival_s": 2, "completion_s": 3, "prompt_token_ids": [1]}\n'
    )
    code = main(
        [
            "ab",
            "--trace",
            str(trace),
            "--dataset",
            str(chats),
            "--policies",
            "lru,oracle",
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
        ]
    )
    assert code == 2
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err


def test_bench_evictor_reports_json(capsys) -> None:
    assert (
        main(
            [
                "bench",
                "evictor",
                "--ops",
                "4000",
                "--blocks",
                "400",
                "--runs",
                "1",
                "--vllm-python",
                "/nonexistent",
                "--no-progress",
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert set(result["ns_per_op"]) == {"lru", "lpc"}
    assert min(result["block_ops"].values()) >= 4000 and result["ratios"]["lpc_over_lru"] > 0
    assert set(result["body_ns_per_op"]) == {"lru", "lpc"}
    # a body time is the call minus a no-op call: under load it can vanish, and then its
    # ratio is reported as null rather than divided by zero
    body_lru, body_ratio = result["body_ns_per_op"]["lru"], result["body_ratios"]["lpc_over_lru"]
    assert body_ratio > 0 if body_lru > 0 else body_ratio is None
    assert "not measured" in result["vllm_status"]
