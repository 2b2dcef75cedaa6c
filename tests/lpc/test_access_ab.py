"""`lpc train --trace` end to end on a slice of the bundled Mooncake trace, and the access
model as learned LPC's source in `lpc ab --trace`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpc.cli.main import main
from lpc.replay.request_table import common_prefix_tokens, request_table
from lpc.traces.load import TraceOptions, load_trace
from predictor.access_predictor import AccessPredictor
from tests.lpc.traces.helpers import bundled_lines, write_lines

SLICE_LINES = 1500  # about 8 minutes of traffic
# Replaying with the trained model and refusing bad flags need no training-sized slice: a
# 3-minute one has requests in both parts of its split and linked turns for LPC to score.
SHORT_LINES = 600


@pytest.fixture(scope="module")
def short_trace(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("short")
    return write_lines(folder / "short.jsonl", bundled_lines()[:SHORT_LINES])


@pytest.fixture(scope="module")
def slice_trace(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("trace")
    return write_lines(folder / "slice.jsonl", bundled_lines()[:SLICE_LINES])


@pytest.fixture(scope="module")
def trained(slice_trace: Path, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("model") / "access"
    args = ["train", "--trace", str(slice_trace), "--horizon", "60", "--out", str(out)]
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        # two members (the default four: tests/training/test_retrain_traces.py's CLI run)
        assert main([*args, "--hidden", "8,8", "--ensemble", "2", "--json"]) == 0
    return out, json.loads(buffer.getvalue())


def test_common_prefix_tokens() -> None:
    assert common_prefix_tokens([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix_tokens([1, 2], [1, 2, 3]) == 2
    assert common_prefix_tokens([], [1]) == 0


def test_shared_prefix_of_linked_requests(short_trace: Path) -> None:
    trace = load_trace(short_trace, TraceOptions())  # its first 400 are the slice's
    table = request_table(trace.requests[:400])
    first_turns = table.groupby("conversation_id").cumcount() == 0
    assert (table.loc[first_turns, "shared_prefix_tokens"] == 0).all()
    later = table.loc[~first_turns]
    assert len(later) > 0 and (later["shared_prefix_tokens"] > 0).all()
    assert (later["shared_prefix_tokens"] <= later["prompt_tokens"]).all()


def test_train_on_a_trace_end_to_end(trained) -> None:
    out, report = trained
    assert report["horizon_s"] == 60 and report["hidden_sizes"] == [8, 8]
    assert set(report["metrics"]) == {"mlp", "gbm", "turns_only"}
    for metrics in report["metrics"].values():
        assert {"roc_auc", "mcc", "macro_f1", "brier"} <= set(metrics)
    split = report["split"]
    assert split["train_requests"] + split["eval_requests"] == SLICE_LINES
    assert all(counts["censored"] >= 0 for counts in report["samples"].values())
    predictor = AccessPredictor.load(out)
    assert predictor.feature_names == tuple(report["features"])


def test_ab_runs_learned_lpc_from_the_access_model(short_trace: Path, trained, tmp_path) -> None:
    import contextlib
    import io

    model, _ = trained
    buffer = io.StringIO()
    args = ["ab", "--trace", str(short_trace), "--model", str(model), "--policies", "lru,lpc"]
    args += ["--cache-sizes", "1000000,2000000", "--out", str(tmp_path), "--no-progress"]
    with contextlib.redirect_stdout(buffer):
        assert main([*args, "--json", "--workers", "1"]) == 0
    outcome = json.loads(buffer.getvalue())
    policies = {r["policy"] for r in outcome["results"]}
    assert policies == {"lru", "lpc"}
    assert all(0 <= r["token_hit_ratio"] <= 1 for r in outcome["results"])


def test_train_trace_needs_out_and_a_valid_feature(short_trace: Path, tmp_path, capsys) -> None:
    assert main(["train", "--trace", str(short_trace)]) == 2
    assert "give --out FOLDER" in capsys.readouterr().err
    args = ["train", "--trace", str(short_trace), "--out", str(tmp_path / "m")]
    assert main([*args, "--access-features", "log_turn,log_shoe_size"]) == 2
    assert "--access-features: unknown feature 'log_shoe_size'" in capsys.readouterr().err
    # a registered text-model feature has no trace-table computation: refused by name
    assert main([*args, "--access-features", "log_turn,reply_asks"]) == 2
    assert "['reply_asks'], which cannot be computed from a trace" in capsys.readouterr().err
    assert (
        main(["train", "--trace", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "m")]) == 2
    )
    assert "no such trace file" in capsys.readouterr().err


def test_bench_access_reports_measured_figures(trained, capsys) -> None:
    model, _ = trained
    args = ["bench", "access", "--model", str(model), "--requests", "3000", "--single", "50"]
    assert main([*args, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["features"] == len(AccessPredictor.load(model).feature_names)
    assert figures["batched_requests_per_s"] > 0 and figures["one_request_us_median"] > 0
    assert figures["load_ms_median"] > 0 and figures["train_wall_s"] is None
    assert main(["bench", "access", "--model", str(model), "--requests", "0"]) == 2


def test_bailian_types_reach_the_request_table(tmp_path: Path) -> None:
    from predictor.access_features import default_feature_names, feature_frame
    from tests.lpc.traces.test_import import BAILIAN_FIXTURE

    trace = load_trace(write_lines(tmp_path / "b.jsonl", BAILIAN_FIXTURE), TraceOptions())
    assert trace.request_types == ["text", "text", "search", "image", "file", "search"]
    table = request_table(trace.requests, trace.request_types)
    names = default_feature_names(list(table.columns))
    assert "type_search" in names
    values = feature_frame(table, names)
    assert values["type_search"].tolist() == [0, 0, 1, 0, 0, 1]
