"""The daily job: promotion, rejection of a worse model, no new data, lock, failures, reload."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from predictor.artifact import load_artifact
from tests.predictor.fakes import HashingEmbedder
from tests.training.synthetic import synthetic_conversations, write_openai_jsonl
from training.embedding_cache import EmbedOptions
from training.fit import FitConfig
from training.model_registry import ModelRegistry
from training.pipeline import TrainConfig
from training.retrain import (
    BAD_INPUT,
    EXIT_CODES,
    FAILED,
    KEPT,
    LOCKED,
    NO_NEW_DATA,
    PROMOTED,
    RetrainConfig,
    decide,
    run_retrain,
)

GOOD = TrainConfig(
    hidden_sizes=(32, 32), fit=FitConfig(max_epochs=8, batch_size=64, learning_rate=1e-2)
)
# barely trained: close to a coin flip on the held-out half
BAD = TrainConfig(
    hidden_sizes=(32, 32), fit=FitConfig(max_epochs=1, batch_size=64, learning_rate=1e-6)
)


NOW = datetime(2025, 6, 3, 3, 0, tzinfo=UTC)


def retrain(config: RetrainConfig):
    """One run on 2025-06-03, when the synthetic logs (June 1 and 2) are fresh."""
    return run_retrain(config, fake_loader, lambda message: None, now=NOW)


def fake_loader(spec: str) -> HashingEmbedder:
    return HashingEmbedder(dim=32)


def config(tmp_path: Path, train: TrainConfig = GOOD, **kwargs) -> RetrainConfig:
    return RetrainConfig(
        logs_dir=tmp_path / "logs",
        registry_dir=tmp_path / "registry",
        cache_dir=tmp_path / "cache",
        train=train,
        embed=EmbedOptions(progress=False),
        **kwargs,
    )


def add_log(tmp_path: Path, day: int, count: int = 200) -> Path:
    return write_openai_jsonl(
        tmp_path / "logs" / f"chats-2025-06-{day:02d}.jsonl",
        synthetic_conversations(count, seed=day, prefix=f"d{day}-"),
    )


def test_promotes_then_rejects_a_worse_model_then_has_nothing_to_do(tmp_path):
    add_log(tmp_path, 1)
    first = retrain(config(tmp_path))
    assert (first.status, first.exit_code) == (PROMOTED, 0), first.reason
    assert first.reason == "no current model"
    registry = ModelRegistry(tmp_path / "registry")
    assert registry.current_version() == first.version == "v0001"

    add_log(tmp_path, 2)
    second = retrain(config(tmp_path, BAD))
    assert (second.status, second.exit_code) == (KEPT, 3)
    assert second.reason.startswith("worse: candidate roc_auc")
    assert second.candidate_metrics["roc_auc"] < second.current_metrics["roc_auc"] - 0.005
    assert registry.current_version() == "v0001"  # untouched
    kept = load_artifact(registry.root / second.version).metadata.notes["registry"]
    assert kept["decision"] == KEPT and kept["reason"] == second.reason
    assert kept["compared_with"] == "v0001"

    third = retrain(config(tmp_path))
    assert (third.status, third.exit_code) == (NO_NEW_DATA, 4)
    assert registry.versions() == ["v0001", "v0002"]

    forced = retrain(config(tmp_path, force=True))
    assert forced.status == PROMOTED and forced.reason.startswith("not worse")
    assert registry.current_version() == forced.version == "v0003"
    assert [e["status"] for e in registry.history()] == [PROMOTED, KEPT, PROMOTED]


def test_trains_on_new_files_plus_the_window(tmp_path):
    add_log(tmp_path, 1, count=100)
    retrain(config(tmp_path))
    add_log(tmp_path, 2, count=100)
    outcome = retrain(config(tmp_path))
    assert outcome.data["new_files"] == ["chats-2025-06-02.jsonl"]
    assert outcome.data["files"] == ["chats-2025-06-01.jsonl", "chats-2025-06-02.jsonl"]
    assert outcome.data["conversations"] == 200


def test_a_held_lock_stops_a_second_run(tmp_path):
    add_log(tmp_path, 1, count=50)
    registry = ModelRegistry(tmp_path / "registry")
    with registry.lock():
        outcome = retrain(config(tmp_path))
    assert (outcome.status, outcome.exit_code) == (LOCKED, 5)
    assert registry.versions() == []


def test_a_failure_is_reported_and_recorded(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "chats-2025-06-01.jsonl").write_text('{"messages": "oops"}\n')
    outcome = retrain(config(tmp_path))
    assert (outcome.status, outcome.exit_code) == (FAILED, 1)
    # The reason names the error's type and what was wrong with the data.
    assert outcome.reason.startswith("InvalidInputError: the training half gives 0 training")
    assert ModelRegistry(tmp_path / "registry").history()[-1]["status"] == FAILED


def test_decision_rules():
    assert decide({"roc_auc": 0.7}, None, "roc_auc", 0.01, 500, 200).promote
    assert decide({"roc_auc": 0.695}, {"roc_auc": 0.7}, "roc_auc", 0.01, 500, 200).promote
    assert not decide({"roc_auc": 0.68}, {"roc_auc": 0.7}, "roc_auc", 0.01, 500, 200).promote
    few = decide({"roc_auc": 0.9}, {"roc_auc": 0.7}, "roc_auc", 0.01, 50, 200)
    assert not few.promote and "too few" in few.reason
    broken = decide({"roc_auc": 0.6}, None, "roc_auc", 0.01, 500, 200, "checksum mismatch")
    assert broken.promote and "checksum" in broken.reason
    assert EXIT_CODES == {PROMOTED: 0, FAILED: 1, BAD_INPUT: 2, KEPT: 3, NO_NEW_DATA: 4, LOCKED: 5}


def test_a_running_server_reloads_the_promoted_model_without_dropping_requests(tmp_path):
    from predictor.predictor import Predictor
    from predictor.server import ServerConfig, create_app
    from tests.predictor import server_harness as loopback
    from tests.predictor.server_harness import running_server

    add_log(tmp_path, 1, count=150)
    retrain(config(tmp_path))
    registry = ModelRegistry(tmp_path / "registry")
    served = Predictor.load(registry.current_link, embedder=HashingEmbedder(dim=32))
    server_config = ServerConfig(model_root=registry.root)
    app = create_app(server_config, served, artifact_path=registry.current_link)
    item = {
        "conversation_id": "c",
        "user_prompts": ["python chess next next next"],
        "turn_count": 1,
    }
    statuses: list[int] = []
    stop = threading.Event()

    with running_server(app, server_config) as (url, _):

        def keep_asking() -> None:
            with loopback.http_client(timeout=30) as client:
                while not stop.is_set():
                    statuses.append(
                        client.post(f"{url}/v1/predict", json={"items": [item]}).status_code
                    )

        before = loopback.get(f"{url}/healthz").json()["model"]
        worker = threading.Thread(target=keep_asking)
        worker.start()
        try:
            add_log(tmp_path, 2, count=150)
            outcome = retrain(config(tmp_path, notify_url=url))
        finally:
            stop.set()
            worker.join()
        after = loopback.get(f"{url}/healthz").json()["model"]

    assert outcome.status == PROMOTED and outcome.notified is True
    assert after["generation"] == before["generation"] + 1
    new_weights = load_artifact(registry.root / outcome.version).metadata.weights_sha256
    assert after["weights_sha256"] == new_weights != before["weights_sha256"]
    assert statuses and set(statuses) == {200}


def test_a_failed_notification_keeps_the_promotion(tmp_path):
    add_log(tmp_path, 1, count=80)
    outcome = retrain(config(tmp_path, notify_url="http://127.0.0.1:9"))
    assert outcome.status == PROMOTED and outcome.notified is False
    assert ModelRegistry(tmp_path / "registry").current_version() == outcome.version


def test_config_validation_names_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"RetrainConfig\.metric"):
        config(tmp_path, metric="accuracy")
    with pytest.raises(ValueError, match=r"RetrainConfig\.notify_url"):
        config(tmp_path, notify_url="127.0.0.1:8476")
