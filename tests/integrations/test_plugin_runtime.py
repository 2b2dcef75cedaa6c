"""The plugin's per-request logic without vLLM: where a release's p comes from, and the
dependency error when a predictor is configured but its client cannot be imported."""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from lpc.integrations import vllm_plugin
from lpc.integrations.config import PluginConfig, PluginConfigError
from lpc.integrations.predictions import PredictionBoard
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_plugin import PluginRuntime, make_predictor_client
from lpc.integrations.vllm_queue import QueueRuntime


@dataclass
class Params:
    extra_args: dict[str, Any] | None = None


@dataclass
class Request:
    request_id: str
    sampling_params: Params | None = field(default_factory=Params)
    num_prompt_tokens: Any = 12  # vLLM's count of the prompt's tokens


class Answers:
    def __init__(self) -> None:
        self.items: list[Mapping[str, Any]] = []

    def predict(self, items: Sequence[Mapping[str, Any]]) -> list[float]:
        self.items.extend(items)
        return [0.9 for _ in items]


def runtime_with(board: bool = True, client: Any = None) -> PluginRuntime:
    stats = PluginStats()
    config = PluginConfig(trust_request_hints=True)  # requests carry p as a trusted API sets it
    queues = QueueRuntime(config, stats, clock=lambda: 42.0)
    client = (client or Answers()) if board else None
    return PluginRuntime(
        config, stats, queues, client, PredictionBoard(client, stats) if board else None
    )


def wait_for(runtime: PluginRuntime) -> None:
    deadline = time.monotonic() + 10
    assert runtime.board is not None
    while runtime.board.in_flight:
        assert time.monotonic() < deadline, "prediction worker stuck"
        time.sleep(0.001)


def test_request_probability_first_then_prediction_then_fallback() -> None:
    runtime = runtime_with()
    carried = Request("r1", Params({"lpc_probability": 0.3, "lpc_conversation_id": "c"}))
    predicted = Request("r2", Params({"lpc_conversation_id": "d", "lpc_user_prompts": ["hello"]}))
    plain = Request("r3")
    for request in (carried, predicted, plain):
        runtime.on_scheduled(request)
    wait_for(runtime)
    releases = [runtime.release_for(r) for r in (carried, predicted, plain)]
    assert [(r.probability, r.conversation_id, r.time_s) for r in releases] == [
        (0.3, "c", 42.0),
        (0.9, "d", 42.0),
        (None, "r3", 42.0),  # no conversation named: the request is its own
    ]
    stats = runtime.stats.snapshot()
    assert stats["releases"] == 3 and stats["probabilities_from_request"] == 1
    assert stats["predictions_used"] == 1 and stats["fallbacks_used"] == 1
    assert stats["predictions_requested"] == 1, "a request carrying p is not predicted"
    assert runtime.hints == {}, "per-request state must not outlive the request"
    runtime.board.close()


def test_a_request_is_asked_for_once_however_often_it_is_scheduled() -> None:
    runtime = runtime_with()
    request = Request("r", Params({"lpc_conversation_id": "d", "lpc_user_prompts": ["x"]}))
    for _ in range(50):  # allocate_slots runs at every decode step
        runtime.on_scheduled(request)
    wait_for(runtime)
    assert runtime.stats.predictions_requested == 1
    runtime.release_for(request)
    runtime.board.close()


def test_the_item_carries_the_prompt_token_count() -> None:
    client = Answers()
    runtime = runtime_with(client=client)
    hints = {"lpc_conversation_id": "d", "lpc_user_prompts": ["x", "y"], "lpc_turn_count": 3}
    for rid, count in [("r1", 731), ("r2", 0), ("r3", None), ("r4", True), ("r5", -4)]:
        runtime.on_scheduled(Request(rid, Params(hints), num_prompt_tokens=count))
    wait_for(runtime)
    item = {"conversation_id": "d", "user_prompts": ["x", "y"], "turn_count": 3}
    # Not a count (absent, a bool, negative): the item goes without it, the request is served.
    assert client.items == [
        {**item, "prompt_tokens": 731},
        {**item, "prompt_tokens": 0},
        item,
        item,
        item,
    ]
    runtime.board.close()


def test_the_real_server_predicts_from_the_plugins_items(tmp_path) -> None:
    """The item the plugin sends, through the real client and `lpc serve`'s app, reaches a
    model trained with log_prompt_tokens: the release gets exactly `Predictor.predict`'s p
    for the window with the request's prompt token count."""
    from predictor.features import ConversationWindow
    from predictor.predictor import Predictor
    from predictor.server import ServerConfig, create_app
    from tests.predictor.conftest import make_artifact
    from tests.predictor.fakes import HashingEmbedder
    from tests.predictor.server_harness import running_server

    make_artifact(tmp_path / "model", extra_features=("log_prompt_tokens",))
    predictor = Predictor.load(tmp_path / "model", embedder=HashingEmbedder())
    config = ServerConfig()
    with running_server(create_app(config, predictor), config) as (url, _):
        client = make_predictor_client(PluginConfig(predictor_url=url, predictor_timeout_s=10))
        runtime = runtime_with(client=client)
        hints = {"lpc_conversation_id": "c-9", "lpc_user_prompts": ["hi", "and then?"]}
        requests = [Request(f"r{n}", Params(hints), num_prompt_tokens=n) for n in (40, 4000)]
        for request in requests:
            runtime.on_scheduled(request)
        wait_for(runtime)
        released = [runtime.release_for(request).probability for request in requests]
        runtime.board.close()
        client.close()
    expected = predictor.predict(
        [ConversationWindow("c-9", ("hi", "and then?"), 2, n) for n in (40, 4000)]
    )
    assert released == expected.tolist() and released[0] != released[1]
    assert runtime.stats.predictions_used == 2


def test_malformed_fields_are_counted_and_the_request_served() -> None:
    runtime = runtime_with(board=False)
    release = runtime.release_for(Request("r", Params({"lpc_probability": "high"})))
    assert release.probability is None and runtime.stats.invalid_hints == 1
    pooled = runtime.release_for(Request("pooling", None))  # pooling requests: no params
    assert pooled.probability is None and pooled.conversation_id == "pooling"


def test_deferred_frees_keep_their_requests_release() -> None:
    runtime = runtime_with(board=False)
    blocks = [object(), object()]
    release = runtime.release_for(Request("r", Params({"lpc_probability": 0.8})))
    runtime.hold_for_deferred_free(blocks, release)
    assert runtime.take_deferred_release(list(reversed(blocks))) is release
    assert runtime.deferred_releases == {} and runtime.take_deferred_release(blocks) is None


def test_a_configured_predictor_needs_its_client(monkeypatch: pytest.MonkeyPatch) -> None:
    assert make_predictor_client(PluginConfig()) is None
    real_import = importlib.import_module

    def without_httpx(name: str, *args: Any) -> Any:
        if name == "predictor.client":
            raise ModuleNotFoundError("No module named 'httpx'")
        return real_import(name, *args)

    monkeypatch.setattr(vllm_plugin.importlib, "import_module", without_httpx)
    with pytest.raises(PluginConfigError) as error:
        make_predictor_client(PluginConfig(predictor_url="http://127.0.0.1:8476"))
    message = str(error.value)
    assert "LPC_PREDICTOR_URL is 'http://127.0.0.1:8476'" in message
    assert "No module named 'httpx'" in message and "pip install lpc" in message


def test_the_real_client_is_built_from_the_settings() -> None:
    client = make_predictor_client(
        PluginConfig(predictor_url="http://127.0.0.1:1", predictor_timeout_s=0.2)
    )
    assert type(client).__name__ == "PredictorClient" and client.timeout_s == 0.2
    assert (
        client.predict([{"conversation_id": "c", "user_prompts": ["x"], "turn_count": 1}]) is None
    )
    client.close()


def test_stats_before_registration() -> None:
    if vllm_plugin.is_registered():
        pytest.skip("registered in this process")
    assert vllm_plugin.stats_snapshot() == {"registered": False}
