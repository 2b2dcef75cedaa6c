"""`lpc train`, `lpc retrain` and `lpc ab --model` end to end with a small real embedder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpc.cli.main import main
from predictor.artifact import load_artifact
from tests.training.synthetic import synthetic_conversations, write_openai_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, minilm_path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    data = write_openai_jsonl(root / "chats.jsonl", synthetic_conversations(40, seed=5))
    return {"root": root, "data": data, "embedder": minilm_path}


@pytest.fixture(autouse=True)
def cache_dir(workspace, monkeypatch):
    monkeypatch.setenv("LPC_CACHE_DIR", str(workspace["root"] / "cache"))


def run_json(args: list[str], capsys, expect: int = 0) -> dict:
    code = main([*args, "--json", "--no-progress"])
    captured = capsys.readouterr()
    assert code == expect, captured.err[-2000:]
    return json.loads(captured.out)


def train_args(workspace) -> list[str]:
    return [
        "train",
        "--dataset",
        str(workspace["data"]),
        "--embedder",
        str(workspace["embedder"]),
        "--epochs",
        "3",
        "--hidden",
        "32",
    ]


def test_train_writes_an_artifact_with_metrics_then_reuses_the_cache(workspace, capsys):
    out = workspace["root"] / "model"
    first = run_json([*train_args(workspace), "--out", str(out)], capsys)
    assert first["artifact"] == str(out)
    metrics = load_artifact(out).metadata.metrics
    assert metrics["evaluation"] == first["metrics"]["evaluation"]
    assert {"majority", "rate"} <= set(metrics["turns_ablation"])
    assert first["metrics"]["embedding"]["texts_embedded"] > 0

    registry = workspace["root"] / "registry"
    second = run_json([*train_args(workspace), "--registry", str(registry)], capsys)
    assert second["metrics"]["embedding"]["texts_embedded"] == 0  # all cached
    assert second["version"] == "v0001"
    assert (registry / "current").resolve() == (registry / "v0001").resolve()
    assert second["metrics"]["evaluation"] == first["metrics"]["evaluation"]  # deterministic


def test_ab_runs_the_learned_policy(workspace, capsys):
    model = workspace["root"] / "model"
    if not model.exists():
        run_json([*train_args(workspace), "--out", str(model)], capsys)
    result = run_json(
        [
            "ab",
            "--dataset",
            str(workspace["data"]),
            "--model",
            str(model),
            "--policies",
            "lru,lpc,oracle",
            "--cache-sizes",
            "2000,4000",
            "--duration",
            "all",
            "--max-active",
            "10",
            "--out",
            str(workspace["root"] / "ab"),
        ],
        capsys,
    )
    hit = result["comparison"]["hit_ratio"]
    assert set(hit) == {"lru", "lpc", "oracle"}
    assert all(0 <= v <= 1 for v in hit["lpc"].values())


def test_retrain_exit_codes(workspace, capsys):
    logs = workspace["root"] / "logs"
    write_openai_jsonl(logs / "chats-2025-06-01.jsonl", synthetic_conversations(40, seed=5))
    args = [
        "retrain",
        "--logs",
        str(logs),
        "--registry",
        str(workspace["root"] / "daily"),
        "--embedder",
        str(workspace["embedder"]),
        "--epochs",
        "2",
        "--hidden",
        "16",
        "--window-days",
        "100000",
    ]
    first = run_json(args, capsys, expect=0)
    assert first["status"] == "promoted" and first["version"] == "v0001"
    second = run_json(args, capsys, expect=4)
    assert second["status"] == "no_new_data"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--finish-features", "mood"], "unknown feature 'mood'"),
        (["train", "--validation-fraction", "2"], "validation_fraction"),
        (["train", "--out", ".", "--no-promote"], "--no-promote is for the registry"),
        (["ab", "--model", "/nonexistent/model"], "is not an artifact folder"),
        (
            ["train", "--trace", "mooncake", "--out", "/nonexistent/m", "--teacher-share", "1.5"],
            "--teacher-share must be in [0, 1], got 1.5",
        ),
    ],
)
def test_bad_flags_give_one_clear_line(args, message, capsys):
    assert main(args) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("extra", [[], ["--embed-only"]])
def test_too_little_data_is_one_clear_line(workspace, tmp_path, capsys, extra):
    data = write_openai_jsonl(tmp_path / "two.jsonl", synthetic_conversations(2, seed=1))
    code = main(
        [
            "train",
            "--dataset",
            str(data),
            "--embedder",
            str(workspace["embedder"]),
            "--no-progress",
            "--out",
            str(tmp_path / "m"),
            *extra,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"--dataset {data}:" in err and "samples" in err and "Traceback" not in err
