"""The prediction RPC end to end: real uvicorn on loopback, the real client, real artifacts.

The hashing test embedder makes each window's vector depend on that window alone, and the
Predictor's MLP is evaluated row by row, so answers through the server must equal in-process
`Predictor.predict` bit for bit, whatever the micro-batcher grouped together.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from predictor.access_features import UnservableFeaturesError
from predictor.client import PredictorClient
from predictor.features import ConversationWindow
from predictor.predictor import Predictor
from predictor.rpc_schema import RequestLimits
from predictor.server import ServerConfig, batch_predict, create_app
from tests.predictor import server_harness as loopback
from tests.predictor.conftest import make_artifact, sample_windows, token_windows
from tests.predictor.fakes import HashingEmbedder
from tests.predictor.light_imports import assert_imports_light
from tests.predictor.server_harness import running_server

TOKEN = "s3cret-token"


class GatedPredictor(Predictor):
    """Holds every batch until the test opens `gate` (a subclass per test gives its own): the
    queue stays full, or a request in flight, for as long as the test needs however slow the
    machine, where a sleep's head start could run out first."""

    gate: threading.Event

    def predict(self, windows):
        self.started_windows = getattr(self, "started_windows", 0) + len(windows)
        if not self.gate.wait(timeout=60):
            raise TimeoutError("the test never opened the gate")
        return super().predict(windows)


def gated() -> type[GatedPredictor]:
    return type("Gated", (GatedPredictor,), {"gate": threading.Event()})


def wait_until(condition, what: str) -> None:
    """Polls `condition` (a state the test drives the server into, not a race); 60 s is
    a hang, not a slow machine."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


@pytest.fixture
def reference(tiny_artifact: Path) -> Predictor:
    return Predictor.load(tiny_artifact, embedder=HashingEmbedder())


def serve(artifact: Path, predictor_class=Predictor, **config_changes):
    config = ServerConfig(**{"max_wait_ms": 5.0, **config_changes})
    predictor = predictor_class.load(artifact, embedder=HashingEmbedder())
    return create_app(config, predictor, artifact_path=artifact), config


def test_batched_and_concurrent_answers_equal_in_process(tiny_artifact, reference):
    app, config = serve(tiny_artifact, max_batch=16)
    windows = sample_windows(120)
    expected = reference.predict(windows)
    with running_server(app, config) as (url, _):
        with loopback.predictor_client(url, timeout_s=10) as client:
            assert client.predict(windows[:40]) == expected[:40].tolist()
            assert client.predict(windows) == expected.tolist()  # split into 64 + 56
            assert client.predict([]) == []
        answers: dict[int, list[float] | None] = {}
        singles = 48  # four rounds of 12 concurrent clients, one window each

        def worker(k: int) -> None:
            with loopback.predictor_client(url, timeout_s=10) as own:
                for j in range(k, singles, 12):
                    answers[j] = own.predict([windows[j]])

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [answers[j][0] for j in range(singles)] == expected[:singles].tolist()
        metrics = loopback.get(url + "/metrics").text
    batch_count = _metric(metrics, "lpc_predictor_batch_size_count")
    predictions = _metric(metrics, "lpc_predictor_predictions_total")
    assert predictions == 40 + 120 + singles
    assert batch_count < 2 + 5 + singles  # concurrent singles were batched together


def _metric(text: str, name: str, labels: str = "") -> float:
    for line in text.splitlines():
        if line.startswith(name + labels + " ") or line.startswith(name + "{" + labels):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not in metrics")


def test_dict_items_and_model_info(tiny_artifact, reference):
    app, config = serve(tiny_artifact)
    with running_server(app, config) as (url, _), loopback.predictor_client(url) as client:
        item = {"conversation_id": "x", "user_prompts": ["hi"], "turn_count": 1}
        expected = reference.predict([ConversationWindow("x", ("hi",), 1)])
        assert client.predict([item]) == expected.tolist()
        health = client.health()
    assert health["status"] == "ok"
    assert health["model"]["embedder_id"] == "test-hashing-embedder"
    assert health["model"]["generation"] == 1


VALID = {"conversation_id": "c", "user_prompts": ["a", "b"], "turn_count": 2}


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """One server with small request limits for every invalid payload: a refused body leaves
    no state behind (each case still checks the server healthy after its answer)."""
    artifact = tmp_path_factory.mktemp("limited") / "artifact"
    make_artifact(artifact)
    limits = RequestLimits(max_items_per_request=8, max_prompt_chars=100, max_prompts_per_item=4)
    app, config = serve(artifact, limits=limits)
    with running_server(app, config) as (url, _), loopback.http_client(base_url=url) as client:
        yield client


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"items": []}, ["items"]),
        ({}, ["items"]),
        ({"items": [VALID], "extra": 1}, ["extra"]),
        ({"items": [{**VALID, "turn_count": "2"}]}, ["items", 0, "turn_count"]),
        ({"items": [{**VALID, "turn_count": 2.0}]}, ["items", 0, "turn_count"]),
        ({"items": [{**VALID, "turn_count": True}]}, ["items", 0, "turn_count"]),
        ({"items": [{**VALID, "turn_count": -3}]}, ["items", 0, "turn_count"]),
        ({"items": [{**VALID, "turn_count": 1}]}, ["items", 0]),
        ({"items": [{**VALID, "prompt_tokens": "12"}]}, ["items", 0, "prompt_tokens"]),
        ({"items": [{**VALID, "prompt_tokens": 12.0}]}, ["items", 0, "prompt_tokens"]),
        ({"items": [{**VALID, "prompt_tokens": True}]}, ["items", 0, "prompt_tokens"]),
        ({"items": [VALID, {**VALID, "prompt_tokens": -1}]}, ["items", 1, "prompt_tokens"]),
        ({"items": [{**VALID, "prompt_tokens": 10**12}]}, ["items", 0, "prompt_tokens"]),
        ({"items": [{**VALID, "request_tokens": 12}]}, ["items", 0, "request_tokens"]),
        ({"items": [{**VALID, "user_prompts": []}]}, ["items", 0, "user_prompts"]),
        ({"items": [{**VALID, "user_prompts": ["a", 7]}]}, ["items", 0, "user_prompts", 1]),
        ({"items": [{**VALID, "user_prompts": "ab"}]}, ["items", 0, "user_prompts"]),
        ({"items": [{**VALID, "conversation_id": 5}]}, ["items", 0, "conversation_id"]),
        (
            {"items": [VALID, {"user_prompts": ["a"], "turn_count": 1}]},
            ["items", 1, "conversation_id"],
        ),
        ({"items": [{**VALID, "user_prompts": ["x" * 101]}]}, ["items", 0, "user_prompts", 0]),
        ({"items": [VALID] * 9}, ["items"]),
        (
            {"items": [{**VALID, "user_prompts": ["a"] * 5, "turn_count": 5}]},
            ["items", 0, "user_prompts"],
        ),
        ([VALID], []),
    ],
)
def test_invalid_payloads_get_precise_422(limited_server: httpx.Client, body, where):
    response = limited_server.post("/v1/predict", json=body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(d["loc"][: len(where)] == where for d in detail), detail
    assert all(d["msg"] for d in detail)
    assert limited_server.get("/healthz").status_code == 200


def test_raw_bodies_nan_bad_json_and_oversize(tiny_artifact):
    limits = RequestLimits(
        max_items_per_request=2, max_prompt_chars=10, max_prompts_per_item=2, max_body_bytes=4096
    )
    app, config = serve(tiny_artifact, limits=limits)
    with running_server(app, config) as (url, _):
        nan = '{"items": [{"conversation_id": "c", "user_prompts": ["a"], "turn_count": NaN}]}'
        response = loopback.post(url + "/v1/predict", content=nan)
        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == ["items", 0, "turn_count"]
        inf = nan.replace("NaN", "Infinity")
        assert loopback.post(url + "/v1/predict", content=inf).status_code == 422
        broken = loopback.post(url + "/v1/predict", content=b"{not json")
        assert broken.status_code == 422 and broken.json()["detail"][0]["type"] == "json_invalid"
        huge = b'{"items": [' + b" " * (limits.max_body_bytes + 10) + b"]}"
        assert loopback.post(url + "/v1/predict", content=huge).status_code == 413
        metrics = loopback.get(url + "/metrics").text
    assert _metric(metrics, "lpc_predictor_errors_total", '{kind="invalid"}') == 3
    assert (
        _metric(metrics, "lpc_predictor_requests_total", '{endpoint="predict",status="422"}') == 3
    )


def test_overload_answers_503_and_the_server_stays_healthy(tiny_artifact, reference):
    predictor_class = gated()
    app, config = serve(tiny_artifact, predictor_class, max_batch=2, max_queue_items=4)
    windows = sample_windows(24, seed=3)
    expected = reference.predict(windows)
    statuses: list[int] = [0] * len(windows)
    bodies: list[dict] = [{}] * len(windows)
    with running_server(app, config) as (url, _):

        def worker(j: int) -> None:
            body = {
                "items": [
                    json.loads(
                        json.dumps(
                            {
                                "conversation_id": windows[j].conversation_id,
                                "user_prompts": list(windows[j].user_prompts),
                                "turn_count": windows[j].turn_count,
                            }
                        )
                    )
                ]
            }
            response = loopback.post(url + "/v1/predict", json=body, timeout=30)
            statuses[j] = response.status_code
            bodies[j] = response.json()

        threads = [threading.Thread(target=worker, args=(j,)) for j in range(len(windows))]
        for t in threads:
            t.start()
        # Held batches: 24 requests cannot all fit a queue of 4 and a batch of 2.
        wait_until(lambda: 503 in statuses, "no request was refused while the batches were held")
        predictor_class.gate.set()
        for t in threads:
            t.join()
        assert loopback.get(url + "/healthz").json()["status"] == "ok"
        metrics = loopback.get(url + "/metrics").text
    assert set(statuses) == {200, 503}
    for j, status in enumerate(statuses):
        if status == 200:
            assert bodies[j]["probabilities"] == [expected[j]]
        else:
            assert bodies[j]["detail"] == "overloaded"
    assert _metric(metrics, "lpc_predictor_errors_total", '{kind="overloaded"}') == statuses.count(
        503
    )
    assert _metric(metrics, "lpc_predictor_queue_depth") == 0


def test_bearer_token(tiny_artifact, reference):
    app, config = serve(tiny_artifact, token=TOKEN)
    window = sample_windows(1)
    with running_server(app, config) as (url, _):
        body = {"items": [{"conversation_id": "c", "user_prompts": ["a"], "turn_count": 1}]}
        assert loopback.post(url + "/v1/predict", json=body).status_code == 401
        wrong = {"Authorization": "Bearer nope-nope-nope"}
        assert loopback.post(url + "/v1/predict", json=body, headers=wrong).status_code == 401
        assert loopback.post(url + "/v1/reload", json={}).status_code == 401
        with loopback.predictor_client(url, token=TOKEN) as client:
            assert client.predict(window) == reference.predict(window).tolist()
        with loopback.predictor_client(url) as anonymous:
            assert anonymous.predict(window) is None
            assert anonymous.stats.http_errors == 1
        assert loopback.get(url + "/healthz").status_code == 200
        assert "lpc_predictor_requests_total" in loopback.get(url + "/metrics").text


def test_reload_swaps_the_model_between_batches(tmp_path, tiny_artifact, reference):
    app, config = serve(tiny_artifact)
    promoted = tmp_path / "promoted"
    make_artifact(promoted, seed=7)
    fresh = Predictor.load(promoted, embedder=HashingEmbedder())
    windows = sample_windows(5)
    with (
        running_server(app, config) as (url, _),
        loopback.predictor_client(url, timeout_s=10) as client,
    ):
        assert client.predict(windows) == reference.predict(windows).tolist()
        response = loopback.post(url + "/v1/reload", json={"artifact": str(promoted)})
        assert response.status_code == 200, response.text
        assert response.json()["model"]["generation"] == 2
        assert client.predict(windows) == fresh.predict(windows).tolist()
        broken = tmp_path / "broken"
        make_artifact(broken, seed=8)
        (broken / "model.safetensors").write_bytes(b"junk")
        failed = loopback.post(url + "/v1/reload", json={"artifact": str(broken)})
        assert failed.status_code == 409 and "still serving generation 2" in failed.text
        outside = loopback.post(url + "/v1/reload", json={"artifact": "/etc"})
        assert outside.status_code == 403
        assert client.predict(windows) == fresh.predict(windows).tolist()
        back = loopback.post(url + "/v1/reload", json={})  # bare reload: the startup artifact
        assert back.status_code == 200
        assert client.predict(windows) == reference.predict(windows).tolist()
        metrics = loopback.get(url + "/metrics").text
    assert _metric(metrics, "lpc_predictor_reloads_total", '{outcome="ok"}') == 2
    assert _metric(metrics, "lpc_predictor_reloads_total", '{outcome="failed"}') == 1


def test_graceful_shutdown_finishes_requests_in_flight(tiny_artifact, reference):
    predictor_class = gated()  # the first batch is held until the shutdown has begun
    app, config = serve(tiny_artifact, predictor_class, max_batch=4)
    windows = sample_windows(8, seed=5)
    expected = reference.predict(windows).tolist()
    results: dict[int, list[float] | None] = {}
    with running_server(app, config) as (url, server):

        def worker(j: int) -> None:
            with loopback.predictor_client(url, timeout_s=20) as client:
                results[j] = client.predict([windows[j]])

        threads = [threading.Thread(target=worker, args=(j,)) for j in range(len(windows))]
        for t in threads:
            t.start()
        predictor, batcher = app.state.slot.current, app.state.batcher
        deadline = time.monotonic() + 20
        while getattr(predictor, "started_windows", 0) + batcher.queued_items < len(windows):
            assert time.monotonic() < deadline, "requests never reached the server"
            time.sleep(0.005)
        server.should_exit = True
        wait_until(
            lambda: not any(listener.is_serving() for listener in server.servers),
            "the server never began its shutdown",
        )
        predictor_class.gate.set()
        for t in threads:
            t.join()
    assert [results[j][0] for j in range(len(windows))] == expected


def test_client_never_raises(tiny_artifact):
    with loopback.predictor_client("http://127.0.0.1:9", timeout_s=0.5) as refused:
        assert refused.predict(sample_windows(2)) is None
        assert refused.stats.connection_errors == 1 and refused.stats.failures == 1

    def junk(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"not json")

    def wrong_length(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"probabilities": [0.5, 0.5, 0.5]})

    def out_of_range(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"probabilities": [1.5]})

    def server_error(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"detail": "boom"})

    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    for handler, kind in [
        (junk, "malformed"),
        (wrong_length, "malformed"),
        (out_of_range, "malformed"),
        (server_error, "http_errors"),
        (timeout, "timeouts"),
    ]:
        client = PredictorClient("http://predictor", transport=httpx.MockTransport(handler))
        assert client.predict(sample_windows(1)) is None
        assert getattr(client.stats, kind) == 1 and client.stats.failures == 1
    bad_item = PredictorClient("http://predictor", transport=httpx.MockTransport(junk))
    assert bad_item.predict([object()]) is None
    assert bad_item.stats.invalid_input == 1


def test_client_refuses_items_that_are_not_json_before_sending_any():
    """A NaN or an infinity in an item (or a value of no JSON type) is an invalid input,
    found before the first of the item's requests is sent (it counted as a connection
    error, raised inside httpx's encoder)."""
    sent = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"probabilities": [0.5] * len(sent[-1]["items"])})

    client = PredictorClient(
        "http://predictor", transport=httpx.MockTransport(answer), max_items_per_request=2
    )
    good = {"conversation_id": "c", "access_features": {"log_turn": 0.5}}
    for bad in (float("nan"), float("inf"), -float("inf"), {1, 2}):
        items = [good, good, {**good, "access_features": {"log_turn": bad}}]
        assert client.predict(items) is None
    assert client.stats.invalid_input == client.stats.failures == 4 and sent == []
    assert client.predict([good, good, good]) == [0.5] * 3
    assert [len(body["items"]) for body in sent] == [2, 1] and sent[1]["items"] == [good]


def test_client_times_out_against_a_slow_server(tiny_artifact):
    predictor_class = gated()  # the batch answers only once the client has given up
    app, config = serve(tiny_artifact, predictor_class)
    with (
        running_server(app, config) as (url, _),
        loopback.predictor_client(url, timeout_s=0.05) as client,
    ):
        assert client.predict(sample_windows(1)) is None
        assert client.stats.timeouts == 1
        predictor_class.gate.set()


def test_server_config_validation():
    with pytest.raises(ValueError, match="max_batch"):
        ServerConfig(max_batch=0)
    with pytest.raises(ValueError, match="max_wait_ms"):
        ServerConfig(max_wait_ms=float("nan"))
    with pytest.raises(ValueError, match="token"):
        ServerConfig(token="short")
    with pytest.raises(ValueError, match="max_prompt_chars"):
        RequestLimits(max_prompt_chars=0)


def test_client_imports_stay_light():
    """The vLLM plugin imports the client inside vLLM's environment: no torch, no pydantic."""
    assert_imports_light(
        "predictor.client",
        ("torch", "pydantic", "fastapi", "transformers", "sentence_transformers"),
    )


# -- models trained with log_prompt_tokens ------------------------------------------------
def test_prompt_tokens_answers_equal_in_process(prompt_tokens_artifact):
    """Batched, split and concurrent requests carry each item's prompt_tokens through to the
    model: every answer is the in-process `Predictor.predict` answer, bit for bit."""
    app, config = serve(prompt_tokens_artifact, max_batch=8)
    windows = token_windows(90, seed=7)
    expected = Predictor.load(prompt_tokens_artifact, embedder=HashingEmbedder()).predict(windows)
    with running_server(app, config) as (url, _):
        with loopback.predictor_client(url, timeout_s=10) as client:
            assert client.predict(windows) == expected.tolist()  # 64 + 26, batches of 8
            assert client.predict([w.to_dict() for w in windows[:5]]) == expected[:5].tolist()
            health = client.health()
        answers: dict[int, list[float] | None] = {}
        singles = 36  # four rounds of 9 concurrent clients, one window each

        def worker(k: int) -> None:
            with loopback.predictor_client(url, timeout_s=10) as own:
                for j in range(k, singles, 9):
                    answers[j] = own.predict([windows[j]])

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [answers[j][0] for j in range(singles)] == expected[:singles].tolist()
    assert health["model"]["extra_features"] == ["log_prompt_tokens"]
    assert health["model"]["serving_tokenizer"] == "test-tokenizer+chatml"


def test_items_without_prompt_tokens_get_a_422_naming_them(prompt_tokens_artifact):
    app, config = serve(prompt_tokens_artifact)
    with_tokens = {**VALID, "prompt_tokens": 40}
    with running_server(app, config) as (url, _):
        body = {"items": [with_tokens, VALID, with_tokens, {**VALID, "prompt_tokens": None}]}
        response = loopback.post(url + "/v1/predict", json=body)
        assert response.status_code == 422, response.text
        detail = response.json()["detail"]
        assert [d["loc"] for d in detail] == [
            ["items", 1, "prompt_tokens"],
            ["items", 3, "prompt_tokens"],
        ]
        assert all("this model needs prompt_tokens" in d["msg"] for d in detail)
        with loopback.predictor_client(url) as client:
            assert client.predict([VALID]) is None and client.stats.http_errors == 1
            assert client.predict([with_tokens]) is not None
        metrics = loopback.get(url + "/metrics").text
    assert _metric(metrics, "lpc_predictor_errors_total", '{kind="invalid"}') == 2


def test_a_model_without_extra_features_ignores_prompt_tokens(tiny_artifact, reference):
    app, config = serve(tiny_artifact)
    windows = token_windows(6, seed=2)
    bare = [ConversationWindow(w.conversation_id, w.user_prompts, w.turn_count) for w in windows]
    with running_server(app, config) as (url, _), loopback.predictor_client(url) as client:
        assert client.predict(windows) == reference.predict(bare).tolist()


def test_models_needing_finish_only_features_are_refused(tmp_path, tiny_artifact):
    unservable = tmp_path / "unservable"
    make_artifact(unservable, extra_features=("log_prompt_tokens", "reply_asks"))
    predictor = Predictor.load(unservable, embedder=HashingEmbedder())
    with pytest.raises(UnservableFeaturesError, match=r"\['reply_asks'\]"):
        create_app(ServerConfig(), predictor, artifact_path=unservable)
    # ...and on reload, where the running model keeps serving.
    served = tmp_path / "served"
    shutil.copytree(tiny_artifact, served)
    app, config = serve(served)
    with running_server(app, config) as (url, _):
        response = loopback.post(url + "/v1/reload", json={"artifact": str(unservable)})
        assert response.status_code == 409
        assert "still serving generation 1" in response.text and "reply_asks" in response.text
        assert loopback.get(url + "/healthz").json()["model"]["generation"] == 1


def test_reload_to_a_prompt_tokens_model_mid_queue(tmp_path, tiny_artifact, prompt_tokens_artifact):
    """Windows validated for the old model but batched for a new one that needs
    prompt_tokens get the 422 an arriving request would; the rest of their batch (here one
    batch of two) is answered."""
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(tiny_artifact, old)
    shutil.copytree(prompt_tokens_artifact, new)

    predictor_class = gated()
    app, config = serve(old, predictor_class, max_batch=2, max_queue_items=8)
    first, lacking, carrying = token_windows(3, seed=9)
    lacking = replace(lacking, prompt_tokens=None)
    fresh = Predictor.load(new, embedder=HashingEmbedder())
    responses: dict[str, httpx.Response] = {}
    with running_server(app, config) as (url, _):

        def post(name: str, window: ConversationWindow) -> None:
            responses[name] = loopback.post(
                url + "/v1/predict", timeout=30, json={"items": [window.to_dict()]}
            )

        slow = app.state.slot.current
        threads = [threading.Thread(target=post, args=("first", first))]
        threads[0].start()
        # the old model is busy with `first` (held at the gate)
        wait_until(lambda: getattr(slow, "started_windows", 0) >= 1, "`first` never started")
        for name, window in (("lacking", lacking), ("carrying", carrying)):
            threads.append(threading.Thread(target=post, args=(name, window)))
            threads[-1].start()
        wait_until(lambda: app.state.batcher.queued_items >= 2, "the two never queued")
        reload = loopback.post(url + "/v1/reload", json={"artifact": str(new)})
        assert reload.status_code == 200, reload.text
        assert getattr(slow, "started_windows", 0) == 1, "the swap came too late to test"
        predictor_class.gate.set()
        for t in threads:
            t.join()
    assert responses["first"].status_code == 200
    lacking_answer = responses["lacking"]
    assert lacking_answer.status_code == 422, lacking_answer.text
    assert lacking_answer.json()["detail"][0]["loc"] == ["items", 0, "prompt_tokens"]
    assert responses["carrying"].json() == {"probabilities": fresh.predict([carrying]).tolist()}


def test_batch_predict_answers_the_windows_it_can(tiny_artifact, prompt_tokens_artifact):
    predictor = Predictor.load(prompt_tokens_artifact, embedder=HashingEmbedder())
    windows = token_windows(5, seed=3)
    windows[1] = replace(windows[1], prompt_tokens=None)
    answers = batch_predict(predictor)(windows)
    assert np.isnan(answers[1])
    kept = [0, 2, 3, 4]
    assert np.array_equal(answers[kept], predictor.predict([windows[i] for i in kept]))
    plain = Predictor.load(tiny_artifact, embedder=HashingEmbedder())
    assert batch_predict(plain) == plain.predict  # nothing to check for such a model


# -- bounded JSON nesting, and every error answer counted -----------------------------------
DEEP = 10_000


@pytest.mark.parametrize(
    "body",
    [
        b'{"items": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        b'{"items": [{"conversation_id": "c", "user_prompts": ["a"], "turn_count": 1}], '
        b'"extra": ' + b'[{"k": ' * DEEP + b"1" + b"}]" * DEEP + b"}",
    ],
    ids=["inside-items", "in-an-extra-field"],
)
def test_deeply_nested_bodies_get_a_422_not_a_500(tiny_artifact, body):
    app, config = serve(tiny_artifact)
    with running_server(app, config) as (url, _):
        response = loopback.post(url + "/v1/predict", content=body)
        assert response.status_code == 422, response.text
        (detail,) = response.json()["detail"]
        assert detail["loc"] == ["body"] and detail["type"] == "json_too_deep"
        assert "\n" not in detail["msg"] and "deeper than 32 levels" in detail["msg"]
        reload = loopback.post(url + "/v1/reload", content=b"[" * DEEP)
        assert reload.status_code == 422 and reload.json()["detail"][0]["type"] == "json_too_deep"
        assert loopback.get(url + "/healthz").status_code == 200
        metrics = loopback.get(url + "/metrics").text
    assert _metric(metrics, "lpc_predictor_errors_total", '{kind="invalid"}') == 2
    assert (
        _metric(
            metrics,
            "lpc_predictor_error_responses_total",
            '{endpoint="predict",status="422",status_class="4xx"}',
        )
        == 1
    )
    assert "internal" not in metrics


def test_an_integer_too_long_to_convert_is_a_422_not_a_500(tiny_artifact):
    """Python refuses to convert an integer of more than 4300 digits (a ValueError that is
    not a JSONDecodeError, which escaped the body reader as a plain-text 500)."""
    app, config = serve(tiny_artifact)
    body = b'{"items": [{"conversation_id": "c", "user_prompts": ["a"], "turn_count": %s}]}'
    with running_server(app, config) as (url, _):
        too_long = loopback.post(url + "/v1/predict", content=body % (b"7" * 5000))
        long = loopback.post(url + "/v1/predict", content=body % (b"7" * 4000))
    assert too_long.status_code == 422, too_long.text
    (detail,) = too_long.json()["detail"]
    assert detail["loc"] == ["body"] and detail["type"] == "json_invalid"
    assert "4300 digits" in detail["msg"]
    assert long.status_code == 422  # above max_turn_count, named at the field
    assert long.json()["detail"][0]["loc"] == ["items", 0, "turn_count"]


class InfinitePredictor(Predictor):
    """A faulty model: probabilities that are not probabilities."""

    def predict(self, windows):
        return np.where(np.arange(len(windows)) == 1, np.inf, 0.5)


def test_a_model_answering_no_probability_is_a_json_500_naming_the_items(tiny_artifact):
    """The last guard before JSON (which has no NaN or infinity): a plain-text 500 before."""
    app, config = serve(tiny_artifact, InfinitePredictor)
    with running_server(app, config) as (url, _):
        answer = loopback.post(url + "/v1/predict", json={"items": [VALID, VALID]})
        assert loopback.get(url + "/healthz").status_code == 200
    assert answer.status_code == 500
    assert "no probability in [0, 1] for items [1] (['inf'])" in answer.json()["detail"]


def test_the_nesting_limit_is_a_request_limit(tiny_artifact):
    limits = RequestLimits(max_json_depth=3)  # a predict body nests 4 deep
    app, config = serve(tiny_artifact, limits=limits)
    with running_server(app, config) as (url, _):
        body = b'{"items": [{"conversation_id": "c", "user_prompts": ["a"], "turn_count": 1}]}'
        response = loopback.post(url + "/v1/predict", content=body)
        assert response.status_code == 422
        where = body.index(b'["a"]')
        assert f"byte {where} opens level 4" in response.json()["detail"][0]["msg"]
        assert loopback.post(url + "/v1/reload", json={}).status_code == 200  # 1 level


def reference_depth_offset(body: bytes, max_depth: int) -> int | None:
    """A byte-by-byte JSON scanner: where first_too_deep must agree."""
    depth, inside, escaped = 0, False, False
    for offset, byte in enumerate(body):
        char = chr(byte)
        if inside:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                inside = False
        elif char == '"':
            inside = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                return offset
        elif char in "]}":
            depth -= 1
    return None


def test_first_too_deep_agrees_with_a_byte_scanner_on_json_and_its_prefixes(monkeypatch):
    import random

    import predictor.server_body as server_body

    rng = random.Random(3)

    def value(level: int):
        if level > 6 or rng.random() < 0.3:
            return rng.choice(['a"[{\\', '\\"]', "}}", 1, None, "\\\\", 'x\\\\"'])
        if rng.random() < 0.5:
            return [value(level + 1) for _ in range(rng.randint(0, 3))]
        return {f'k"[{i}\\': value(level + 1) for i in range(rng.randint(0, 3))}

    bodies = [json.dumps(value(0)).encode() for _ in range(24)]
    cases = [  # the reference's answer does not depend on the chunk size: computed once
        (body[:cut], max_depth, reference_depth_offset(body[:cut], max_depth))
        for body in bodies
        for cut in range(0, len(body) + 1, max(1, len(body) // 9))
        for max_depth in (0, 1, 2, 4)
    ]
    for chunk_bytes in (1 << 20, 5, 2, 1):  # chunk boundaries inside escapes and strings
        monkeypatch.setattr(server_body, "SCAN_CHUNK_BYTES", chunk_bytes)
        for prefix, max_depth, expected in cases:
            assert server_body.first_too_deep(prefix, max_depth) == expected, (
                prefix,
                max_depth,
                chunk_bytes,
            )


def test_every_error_answer_is_counted_by_status_and_class(tiny_artifact):
    def exploding_loader(path, current):
        raise RuntimeError("disk on fire")  # not a reload failure the endpoint expects

    config = ServerConfig(token=TOKEN, limits=RequestLimits(max_body_bytes=1024))
    predictor = Predictor.load(tiny_artifact, embedder=HashingEmbedder())
    app = create_app(config, predictor, tiny_artifact, reload_loader=exploding_loader)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with running_server(app, config) as (url, _):
        assert loopback.post(url + "/v1/predict", json={"items": [VALID]}).status_code == 401
        big = loopback.post(url + "/v1/predict", content=b" " * 2048, headers=auth)
        assert big.status_code == 413
        assert loopback.post(url + "/v1/predict", json={}, headers=auth).status_code == 422
        assert loopback.get(url + "/nowhere").status_code == 404
        assert loopback.get(url + "/v1/predict").status_code == 405
        boom = loopback.post(url + "/v1/reload", json={}, headers=auth)
        assert boom.status_code == 500
        assert loopback.post(url + "/v1/predict", json={"items": [VALID]}, headers=auth).is_success
        metrics = loopback.get(url + "/metrics").text

    def errors(endpoint: str, status: int) -> float:
        labels = f'{{endpoint="{endpoint}",status="{status}",status_class="{status // 100}xx"}}'
        return _metric(metrics, "lpc_predictor_error_responses_total", labels)

    assert errors("predict", 401) == errors("predict", 413) == errors("predict", 422) == 1
    assert errors("unmatched", 404) == errors("predict", 405) == errors("reload", 500) == 1
    assert _metric(metrics, "lpc_predictor_errors_total", '{kind="internal"}') == 1
    assert _metric(metrics, "lpc_predictor_requests_total", '{endpoint="reload",status="500"}') == 1
    assert 'status="200"' not in metrics.split("lpc_predictor_error_responses_total", 1)[1]


def test_admission_wait_defaults_to_half_the_timeout_and_is_checked():
    assert ServerConfig(request_timeout_s=8).admission_wait_s == 4
    assert ServerConfig(request_timeout_s=8, max_expected_wait_s=6).admission_wait_s == 6
    for bad in (0, -1, 9, float("nan"), True):
        with pytest.raises(ValueError, match="max_expected_wait_s"):
            ServerConfig(request_timeout_s=8, max_expected_wait_s=bad)


def test_under_overload_the_body_is_not_even_read(tiny_artifact):
    """When no request could be admitted, the refusal comes before the body is parsed: a
    503 even for a body that is not JSON (cheap refusals keep the event loop free)."""

    predictor_class = gated()
    app, config = serve(tiny_artifact, predictor_class, max_batch=1, max_queue_items=1)
    window = {"items": [VALID]}
    with running_server(app, config) as (url, _):
        busy = [
            threading.Thread(
                target=loopback.post,
                args=(url + "/v1/predict",),
                kwargs={"json": window, "timeout": 30},
            )
            for _ in range(2)
        ]
        busy[0].start()
        current = app.state.slot.current
        wait_until(lambda: getattr(current, "started_windows", 0) >= 1, "no batch started")
        busy[1].start()
        wait_until(lambda: app.state.batcher.queued_items >= 1, "nothing queued")
        refused = loopback.post(url + "/v1/predict", content=b"{not json")
        assert refused.status_code == 503 and refused.json()["detail"] == "overloaded"
        assert "queue holds 1 windows" in refused.json()["reason"]
        predictor_class.gate.set()
        for thread in busy:
            thread.join()
        assert loopback.post(url + "/v1/predict", content=b"{not json").status_code == 422
