"""`lpc serve` with an access-only model: items carry access feature values, answers equal
`AccessPredictor` in process, wrong items are 422s, and reloads swap text and access models."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from lpc.cli.main import main
from predictor.access_features import ConversationState, RequestState, feature_row
from predictor.access_predictor import AccessPredictor
from predictor.features import ConversationWindow
from predictor.predictor import Predictor
from predictor.server import ServerConfig, batch_predict, create_app, load_served_model
from tests.integrations.access_models import SHIPPED, publish
from tests.predictor.fakes import HashingEmbedder
from tests.predictor.server_harness import running_server

TEXT_ITEM = {"conversation_id": "t", "user_prompts": ["hi"], "turn_count": 1}


def engine_states() -> list[tuple[RequestState, ConversationState]]:
    """A few requests as an engine sees them: first turns and later ones, short and long gaps."""
    states = []
    for k, think_s in enumerate([0.0, 5.0, 40.0, 900.0, 3600.0]):
        conversation = ConversationState()
        arrival_s = 1000.0
        for turn in range(k + 1):
            request = RequestState(arrival_s, 200 * (turn + 1), 150 * turn, 80 + 10 * k)
            states.append((request, conversation))
            conversation = conversation.after(
                RequestState(
                    arrival_s, request.prompt_tokens, request.shared_prefix_tokens, 80, arrival_s
                )
            )
            arrival_s += think_s + 1.0
    return states


def access_items(model: AccessPredictor) -> tuple[list[dict], np.ndarray]:
    """RPC items for `engine_states()` and `model`'s own answers for them."""
    states = engine_states()
    names = model.feature_names
    items = [
        {
            "conversation_id": f"c{i}",
            "access_features": dict(zip(names, feature_row(names, r, c), strict=True)),
        }
        for i, (r, c) in enumerate(states)
    ]
    return items, model.predict(model.feature_matrix(states))


def serve_access(path: Path, **config_changes):
    config = ServerConfig(**config_changes)
    return create_app(config, AccessPredictor.load(path), artifact_path=path), config


def predict(url: str, items: list[dict]) -> httpx.Response:
    return httpx.post(f"{url}/v1/predict", json={"items": items}, timeout=10)


def test_answers_equal_the_access_predictor_in_process() -> None:
    model = AccessPredictor.load(SHIPPED)
    items, expected = access_items(model)
    app, config = serve_access(SHIPPED)
    with running_server(app, config) as (url, _):
        answered = predict(url, items)
        singles = [predict(url, [item]).json()["probabilities"][0] for item in items[:3]]
        health = httpx.get(f"{url}/healthz").json()
        metrics = httpx.get(f"{url}/metrics").text
    assert answered.status_code == 200, answered.text
    assert answered.json()["probabilities"] == expected.tolist()
    # One row alone goes through another BLAS path than a batch: compare like with like.
    rows = model.feature_matrix(engine_states()[:3])
    assert singles == [float(model.predict(rows[i : i + 1])[0]) for i in range(3)]
    assert singles == pytest.approx(expected[:3].tolist(), rel=1e-5)
    assert health["model"]["kind"] == "access"
    assert health["model"]["embedder_id"] == "none"
    assert health["model"]["access_features"] == list(model.feature_names)
    assert health["model"]["known_at"] == "release"  # the shipped model reads output tokens
    assert 'kind="access"' in metrics
    assert f"lpc_predictor_predictions_total {float(len(items) + 3)}" in metrics


def details(response: httpx.Response) -> list[dict]:
    assert response.status_code == 422, response.text
    return response.json()["detail"]


def test_bad_access_items_get_a_422_naming_item_and_field() -> None:
    model = AccessPredictor.load(SHIPPED)
    items, _ = access_items(model)
    good = items[0]
    values = good["access_features"]
    unknown = {**good, "access_features": {**values, "log_typing_speed": 1.0}}
    missing = {**good, "access_features": {k: v for k, v in values.items() if k != "log_turn"}}
    text_valued = {**good, "access_features": {**values, "log_turn": "1"}}
    app, config = serve_access(SHIPPED)
    with running_server(app, config) as (url, _):
        unknown_answer = details(predict(url, [good, unknown]))
        missing_answer = details(predict(url, [good, good, missing]))
        typed_answer = details(predict(url, [text_valued]))
        wrong_kind = details(predict(url, [good, TEXT_ITEM]))
        nan_body = httpx.post(
            f"{url}/v1/predict",
            content=b'{"items": [{"access_features": {"log_turn": NaN}}]}',
            headers={"content-type": "application/json"},
        )
        extra_field = details(predict(url, [{**good, "turn_count": 3}]))
    assert [d["loc"] for d in unknown_answer] == [
        ["items", 1, "access_features", "log_typing_speed"]
    ]
    assert "does not read 'log_typing_speed'" in unknown_answer[0]["msg"]
    assert [d["loc"] for d in missing_answer] == [["items", 2, "access_features", "log_turn"]]
    assert missing_answer[0]["type"] == "missing"
    assert typed_answer[0]["loc"] == ["items", 0, "access_features", "log_turn"]
    assert [d["loc"] for d in wrong_kind] == [["items", 1]]
    assert "access-only" in wrong_kind[0]["msg"] and "access_features" in wrong_kind[0]["msg"]
    assert nan_body.status_code == 422
    assert extra_field[0]["loc"] == ["items", 0, "turn_count"]


def test_a_text_model_names_access_items_as_the_wrong_kind(tiny_artifact: Path) -> None:
    config = ServerConfig()
    app = create_app(config, Predictor.load(tiny_artifact, embedder=HashingEmbedder()))
    items, _ = access_items(AccessPredictor.load(SHIPPED))
    with running_server(app, config) as (url, _):
        answer = details(predict(url, [TEXT_ITEM, items[0]]))
        health = httpx.get(f"{url}/healthz").json()
    assert [d["loc"] for d in answer] == [["items", 1]]
    assert "reads text windows" in answer[0]["msg"]
    assert health["model"]["kind"] == "text" and health["model"]["access_features"] == []


def test_reload_text_to_access_to_access_and_back(tmp_path: Path, tiny_artifact: Path) -> None:
    registry = tmp_path / "models"
    text = registry / "text"
    shutil.copytree(tiny_artifact, text)
    first = publish(registry, "v1")
    shifted = publish(registry, "v2", bias=1.5)
    broken = registry / "broken"
    shutil.copytree(first, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    text_model = Predictor.load(text, embedder=HashingEmbedder())
    config = ServerConfig(model_root=registry)
    embedders: list[str] = []

    def loader(path: Path, current):  # the real loader, with the test embedder for text
        access = load_served_model(path)
        embedders.append("none" if access is not None else "hashing")
        return access or Predictor.load(path, embedder=HashingEmbedder())

    app = create_app(config, text_model, artifact_path=text, reload_loader=loader)
    access_list, first_expected = access_items(AccessPredictor.load(first))
    _, shifted_expected = access_items(AccessPredictor.load(shifted))
    text_expected = text_model.predict([ConversationWindow("t", ("hi",), 1)])

    def reload(url: str, path: Path) -> httpx.Response:
        return httpx.post(f"{url}/v1/reload", json={"artifact": str(path)}, timeout=30)

    with running_server(app, config) as (url, _):
        assert reload(url, first).json()["model"]["kind"] == "access"
        assert predict(url, access_list).json()["probabilities"] == first_expected.tolist()
        assert details(predict(url, [TEXT_ITEM]))[0]["loc"] == ["items", 0]
        swapped = reload(url, shifted).json()["model"]
        assert predict(url, access_list).json()["probabilities"] == shifted_expected.tolist()
        failed = reload(url, broken)
        assert predict(url, access_list).json()["probabilities"] == shifted_expected.tolist()
        back = reload(url, text).json()["model"]
        assert predict(url, [TEXT_ITEM]).json()["probabilities"] == text_expected.tolist()
        metrics = httpx.get(f"{url}/metrics").text
    assert swapped["generation"] == 3 and swapped["artifact"] == str(shifted)
    assert failed.status_code == 409 and "still serving generation 3" in failed.text
    assert back["kind"] == "text" and back["generation"] == 4
    assert embedders == ["none", "none", "hashing"]  # the broken copy failed its checksum
    assert not np.allclose(first_expected, shifted_expected)
    assert 'lpc_predictor_reloads_total{outcome="failed"} 1.0' in metrics
    assert 'kind="text"' in metrics and 'kind="access"' not in metrics


def test_lpc_serve_starts_an_access_model_without_an_embedder(monkeypatch, capsys) -> None:
    """The CLI path up to serving: no embedder is loaded for an access-only artifact."""
    import predictor.embedders as embedders
    import predictor.server as server

    served: list = []

    def no_embedder(*args, **kwargs):
        raise AssertionError("an access-only model must not load an embedder")

    class Recorder:
        def __init__(self, app) -> None:
            served.append(app.state.slot.current)

        def run(self) -> None:
            pass

    monkeypatch.setattr(embedders, "load_embedder", no_embedder)
    monkeypatch.setattr(server, "uvicorn_server", lambda app, config, log_level: Recorder(app))
    assert main(["serve", "--artifact", str(SHIPPED), "--port", "0"]) == 0
    assert isinstance(served[0], AccessPredictor)
    assert "access-only model" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["text", "access"])
def test_a_model_swapped_in_mid_queue_answers_waiting_text_items_422(
    kind: str, tiny_artifact: Path
) -> None:
    """Text windows queued for a text model when an access model takes over get NaN from
    `batch_predict`, which the endpoint answers with a 422; a text model answers them."""
    text_model = Predictor.load(tiny_artifact, embedder=HashingEmbedder())
    model = AccessPredictor.load(SHIPPED) if kind == "access" else text_model
    window = ConversationWindow("t", ("hi",), 1)
    answers = batch_predict(model)([window, window])
    assert np.isnan(answers).all() == (kind == "access")
