"""`lpc serve` with an access-only model: items carry access feature values, answers equal
`AccessPredictor` in process, wrong items are 422s, and reloads swap text and access models."""

from __future__ import annotations

import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from lpc.cli.main import main
from predictor.access_features import ConversationState, RequestState, feature_row
from predictor.access_predictor import AccessPredictor
from predictor.artifact import ArtifactCorruptError
from predictor.features import ConversationWindow
from predictor.predictor import Predictor
from predictor.server import ServerConfig, batch_predict, create_app, load_served_model
from tests.integrations.access_models import SHIPPED, publish
from tests.predictor import server_harness as loopback
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
    return loopback.post(f"{url}/v1/predict", json={"items": items}, timeout=10)


def test_answers_equal_the_access_predictor_in_process() -> None:
    model = AccessPredictor.load(SHIPPED)
    items, expected = access_items(model)
    app, config = serve_access(SHIPPED)
    with running_server(app, config) as (url, _):
        answered = predict(url, items)
        singles = [predict(url, [item]).json()["probabilities"][0] for item in items[:3]]
        health = loopback.get(f"{url}/healthz").json()
        metrics = loopback.get(f"{url}/metrics").text
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
        nan_body = loopback.post(
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
        health = loopback.get(f"{url}/healthz").json()
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
        return loopback.post(f"{url}/v1/reload", json={"artifact": str(path)}, timeout=30)

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
        metrics = loopback.get(f"{url}/metrics").text
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


# -- values the model's float32 arithmetic cannot hold (issue 25) ----------------------------
# Beyond float32; (3e38 - mean) / std beyond it for some features; overflowing a layer.
OUT_OF_RANGE = [1e39, 1e308, -1e39, 3e38, -3e38, -1e38]


def test_values_the_model_overflows_on_are_422s_naming_item_and_feature() -> None:
    """A finite value beyond float32 (1e39), or so far out that standardising it (3e38 for
    log_turn) or a layer (-1e38 for log_prompt_tokens) overflows float32, was a plain-text
    500 (a NaN probability is not JSON) or a 0 or 1 computed from infinities. Now such a
    request is a 422 at the item and feature, alone or among good items; a value the float32
    arithmetic holds (3e38 for most features, 1e30) is answered, as in process."""
    model = AccessPredictor.load(SHIPPED)
    names = model.feature_names
    items, expected = access_items(model)
    good = items[0]

    def with_value(name: str, value: float) -> dict:
        return {**good, "access_features": {**good["access_features"], name: value}}

    def in_process(batch: list[dict]) -> list[float]:
        with np.errstate(over="ignore"):  # exp(-logit) of a logit of -1e38: probability 0
            return model.predict([[i["access_features"][n] for n in names] for i in batch])

    cases = [
        (name, value, batch)
        for name in names
        for value in OUT_OF_RANGE
        for batch in ([with_value(name, value)], [good, with_value(name, value), good])
    ]
    far = [with_value(name, 1e30) for name in names]
    app, config = serve_access(SHIPPED)
    # A connection per request (a 500 closed its own), several at a time, one client.
    fresh = httpx.Limits(max_keepalive_connections=0)
    with (
        running_server(app, config) as (url, _),
        loopback.http_client(base_url=url, limits=fresh, timeout=10) as http,
        ThreadPoolExecutor(8) as pool,
    ):
        batches = [batch for _, _, batch in cases] + [far, items]
        *answers, far_answer, still = pool.map(
            lambda batch: http.post("/v1/predict", json={"items": batch}), batches
        )
        metrics = http.get("/metrics").text
    refused, layer_overflow = [], {}
    for (name, value, batch), answer in zip(cases, answers, strict=True):
        assert answer.status_code in (200, 422), (name, value, answer.text)
        if answer.status_code == 200:  # the arithmetic held: every item answered
            assert answer.json()["probabilities"] == in_process(batch).tolist()
            continue
        refused.append((name, value))
        (detail,) = answer.json()["detail"]
        at = batch.index(with_value(name, value))
        assert detail["loc"] == ["items", at, "access_features", name], (name, value)
        assert detail["input"] == value, (name, value)
        assert detail["type"] == "out_of_range"
        if abs(value) > 3.5e38:  # beyond float32, whatever the model: refused by the schema
            assert detail["msg"].startswith("Input should be at most 3.4028235e+38 in absolute")
        else:
            assert detail["msg"].startswith(f"{name} = {value!r} is out of the model's range")
            if (name, value) == ("log_prompt_tokens", -1e38):
                layer_overflow = detail
    beyond = [value for _, value in refused if abs(value) > 3.5e38]
    assert sorted(beyond) == sorted([1e39, 1e308, -1e39] * 2 * len(names))  # all of them
    assert {("log_turn", 3e38), ("log_prompt_tokens", -1e38)} <= set(refused)
    assert "standard deviations from its training mean" in layer_overflow["msg"]
    assert far_answer.status_code == 200, far_answer.text
    assert far_answer.json()["probabilities"] == in_process(far).tolist()
    assert still.json()["probabilities"] == expected.tolist()
    assert 'status="500"' not in metrics and "internal" not in metrics


def test_predict_checked_is_predict_except_where_float32_overflows() -> None:
    model = AccessPredictor.load(SHIPPED)
    rows = model.feature_matrix(engine_states())
    column = model.feature_names.index("log_prompt_tokens")
    far = rows[:3].copy()
    far[:, column] = [1e39, -1e38, 1e30]  # beyond float32; a layer overflows; held
    both = np.concatenate([rows, far])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the overflow is no warning either
        checked = model.predict_checked(both)
        standardised = model.standardised(far)
    with np.errstate(over="ignore", invalid="ignore"):
        plain = model.predict(both)
    n = len(rows)
    assert checked[:n].tolist() == plain[:n].tolist() and checked[-1] == plain[-1]
    assert np.isnan(checked[n : n + 2]).all()
    assert np.isnan(plain[n]) and plain[n + 1] == 0.0  # a 0 computed from infinities
    assert np.isinf(standardised[0, column]) and np.isfinite(standardised[1:]).all()


def test_an_artifact_with_non_finite_weights_is_refused_at_load() -> None:
    model = AccessPredictor.load(SHIPPED)
    weights = [w.copy() for w in model.weights]
    weights[1][0, 0] = np.inf
    with pytest.raises(ArtifactCorruptError, match="not a finite float32"):
        AccessPredictor(model.metadata, weights, model.biases)


def test_a_probability_out_of_0_1_is_a_json_500_naming_the_items() -> None:
    """The last guard before JSON: no route serialises a NaN (a plain-text 500 before)."""
    model = AccessPredictor.load(SHIPPED)
    items, _ = access_items(model)
    model.predict_checked = lambda rows: np.where(np.arange(len(rows)) == 1, np.inf, 0.5)
    config = ServerConfig()
    app = create_app(config, model, artifact_path=SHIPPED)
    with running_server(app, config) as (url, _):
        answer = predict(url, items[:3])
        metrics = loopback.get(f"{url}/metrics").text
    assert answer.status_code == 500
    assert "no probability in [0, 1] for items [1] (['inf'])" in answer.json()["detail"]
    assert 'lpc_predictor_errors_total{kind="prediction_failed"} 1.0' in metrics
