"""One feature registry for every model input: a toy feature added as one record, in one
place, reaches training, the RPC schema, the replay, the plugin and the CLI help; the records
shared by access and text models agree on every path; a path a record lacks refuses it by name.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lpc.access.source import AccessSource
from lpc.integrations.access_runtime import AccessRuntime
from lpc.integrations.config import PluginConfig
from lpc.integrations.stats import PluginStats
from lpc.replay.request_table import request_table
from predictor import access_features as registry
from predictor.access_features import (
    FEATURES_BY_NAME,
    ConversationState,
    Feature,
    FeatureError,
    RequestState,
    computable_on,
    default_feature_names,
    feature_frame,
    feature_row,
    sample_matrix,
    window_matrix,
)
from predictor.access_predictor import AccessPredictor
from predictor.features import ConversationWindow
from predictor.predictor import Predictor
from predictor.server import ServerConfig, create_app
from tests.integrations.test_access_runtime import replay_releases, synthetic_requests
from tests.predictor import server_harness as loopback
from tests.predictor.conftest import make_artifact, token_windows, turn_sample
from tests.predictor.fakes import HashingEmbedder
from tests.predictor.server_harness import running_server
from tests.training.test_access_training import synthetic_trace
from training.access_data import access_samples
from training.access_fit import AccessFitConfig, fit_access_model, save_access_model

TOY = "toy_prompt_ktokens"


def toy_record() -> Feature:
    """The one place the toy feature is added: one record in the registry, with a
    computation for every path (prompt tokens in thousands)."""
    return Feature(
        TOY,
        "arrival",
        "prompt tokens / 1000 (a test feature)",
        lambda t: t["prompt_tokens"].astype(np.float64) / 1000.0,
        lambda r, c: r.prompt_tokens / 1000.0,
        from_sample=lambda s: (s.request_tokens - s.output_tokens) / 1000.0,
        from_window=lambda w: w.prompt_tokens / 1000.0,
        sample_needs_token_counts=True,
        window_field="prompt_tokens",
    )


@pytest.fixture
def toy(monkeypatch) -> Feature:
    """The toy feature registered for one test."""
    record = toy_record()
    monkeypatch.setitem(FEATURES_BY_NAME, TOY, record)
    return record


@pytest.fixture(scope="module")
def trained_toy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An access model trained on a small table with the toy feature among its inputs (the
    toy registered while it trains), once for the module: the tests only read it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(FEATURES_BY_NAME, TOY, toy_record())
        table = synthetic_trace(n_conversations=150)
        assert TOY in default_feature_names(list(table.columns))  # training offers it by default
        samples = access_samples(table, ("log_turn", TOY), 3600.0, horizon_s=300.0)
        result = fit_access_model(samples, AccessFitConfig(hidden_sizes=(8,), max_epochs=3))
        (_, toy_input) = result.inputs.access_features
        assert toy_input.name == TOY
        # refitted on the whole training part (fitting + validation slices), standardised on it
        whole = np.concatenate([samples.features["fit"], samples.features["validation"]])
        assert toy_input.mean == pytest.approx(float(whole[:, 1].mean()), rel=1e-5)
        folder = tmp_path_factory.mktemp("toy-access") / "toy-access"
        save_access_model(folder, result, "toy", {})
    return folder


@pytest.fixture
def toy_access_model(toy, trained_toy_model) -> Path:
    """The trained toy model, with the toy registered for the test that reads it."""
    return trained_toy_model


def test_a_toy_feature_reaches_training(toy_access_model) -> None:
    model = AccessPredictor.load(toy_access_model)
    assert model.feature_names == ("log_turn", TOY)
    table = synthetic_trace(n_conversations=150)
    base = model.predict_table(table)
    # The toy's column is an input of the fitted model: change only what it reads, and the
    # answers change; the turn index alone cannot tell these tables apart.
    bigger = table.assign(prompt_tokens=table["prompt_tokens"] * 3)
    assert not np.allclose(model.predict_table(bigger), base)
    rows = feature_frame(table, model.feature_names).to_numpy()
    assert np.array_equal(rows[:, 1], table["prompt_tokens"].to_numpy() / 1000.0)
    np.testing.assert_allclose(model.predict(rows), base)


def test_a_toy_feature_reaches_the_rpc_schema(toy, toy_access_model, tmp_path: Path) -> None:
    model = AccessPredictor.load(toy_access_model)
    request, conversation = RequestState(10.0, 1500), ConversationState()
    row = feature_row(model.feature_names, request, conversation)
    values = dict(zip(model.feature_names, row, strict=True))
    assert values[TOY] == 1.5
    config = ServerConfig()
    app = create_app(config, model, artifact_path=toy_access_model)
    with running_server(app, config) as (url, _):
        health = loopback.get(f"{url}/healthz").json()
        good = loopback.post(f"{url}/v1/predict", json={"items": [{"access_features": values}]})
        without = {k: v for k, v in values.items() if k != TOY}
        missing = loopback.post(f"{url}/v1/predict", json={"items": [{"access_features": without}]})
    assert health["model"]["access_features"] == ["log_turn", TOY]
    assert good.status_code == 200, good.text
    assert good.json()["probabilities"] == [model.predict_one(request, conversation)]
    assert missing.status_code == 422
    assert [d["loc"] for d in missing.json()["detail"]] == [["items", 0, "access_features", TOY]]

    # A text model reading the toy: its items need the window field the toy's record names.
    make_artifact(tmp_path / "text", extra_features=(TOY,))
    text = Predictor.load(tmp_path / "text", embedder=HashingEmbedder())
    app = create_app(config, text, artifact_path=tmp_path / "text")
    item = {"conversation_id": "c", "user_prompts": ["hi"], "turn_count": 1}
    with running_server(app, config) as (url, _):
        lacking = loopback.post(f"{url}/v1/predict", json={"items": [item]})
        answers = [
            loopback.post(f"{url}/v1/predict", json={"items": [{**item, "prompt_tokens": n}]})
            for n in (10, 90_000)
        ]
    assert lacking.status_code == 422
    (detail,) = lacking.json()["detail"]
    assert detail["loc"] == ["items", 0, "prompt_tokens"] and TOY in detail["msg"]
    small, large = (a.json()["probabilities"][0] for a in answers)
    window = ConversationWindow("c", ("hi",), 1, 90_000)
    assert large == text.predict([window])[0] and small != large  # the toy reached the MLP


def test_a_toy_feature_reaches_the_replay(toy_access_model) -> None:
    requests = synthetic_requests()
    source = AccessSource(AccessPredictor.load(toy_access_model))
    replayed = np.array(source.predict_requests(requests))
    model = source.predictor
    prompts = np.array([r.turn.num_prompt_tokens for r in requests])
    rows = feature_frame(request_table(requests), model.feature_names).to_numpy()
    assert np.array_equal(rows[:, 1], prompts / 1000.0)  # computed for each request
    np.testing.assert_allclose(replayed, model.predict(rows))
    zeroed = rows.copy()
    zeroed[:, 1] = 0.0
    assert not np.allclose(replayed, model.predict(zeroed))


def test_a_toy_feature_reaches_the_plugin(toy_access_model) -> None:
    requests = synthetic_requests()
    runtime = AccessRuntime.load(PluginConfig(access_model=str(toy_access_model)), PluginStats())
    assert not runtime.needs_tokens  # neither log_turn's record nor the toy's reads token ids
    engine = replay_releases(runtime, requests)
    model = runtime.predictor
    # The plugin computes the toy from engine state; the table computes it from the trace.
    expected = model.predict_table(request_table(requests))
    got = np.array([engine[r.request_id] for r in requests])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    # the toy's value is what reaches the model: zero its column and the answers move
    rows = feature_frame(request_table(requests), model.feature_names).to_numpy().copy()
    rows[:, 1] = 0.0
    assert not np.allclose(model.predict(rows), got, atol=1e-6)


def test_a_toy_feature_reaches_text_training_and_the_cli_help(toy) -> None:
    windows = token_windows(20, seed=3)
    samples = [turn_sample(w) for w in windows]
    assert np.array_equal(sample_matrix(samples, (TOY,)), window_matrix(windows, (TOY,)))
    assert sample_matrix(samples, (TOY,))[0, 0] == np.float32(windows[0].prompt_tokens / 1000)
    from lpc.cli.main import build_parser

    train = next(a for a in build_parser()._actions if a.dest == "command").choices["train"]
    helps = {o: a.help for a in train._actions for o in a.option_strings}
    assert f"{TOY} (arrival)" in helps["--finish-features"]
    assert f"{TOY} (arrival)" in helps["--access-features"]


def test_shared_records_agree_on_every_path() -> None:
    """`log_prompt_tokens` and `log_output_tokens` are one record each, used by access and
    text models: a table, an engine, a training sample and a window give the same number."""
    windows = token_windows(30, seed=7)
    samples = [turn_sample(w) for w in windows]
    for name in ("log_prompt_tokens", "log_output_tokens"):
        assert name in computable_on("table", "state", "sample")
    for window, sample in zip(windows, samples, strict=True):
        prompt = sample.request_tokens - sample.output_tokens
        state = RequestState(0.0, prompt, output_tokens=sample.output_tokens)
        names = ("log_prompt_tokens", "log_output_tokens")
        by_state = feature_row(names, state, ConversationState())
        by_sample = sample_matrix([sample], names)[0]
        by_window = window_matrix([window], ("log_prompt_tokens",))[0, 0]
        assert by_state == [math.log1p(prompt), math.log1p(sample.output_tokens)]
        assert np.array_equal(by_sample, np.float32(by_state))
        assert by_window == by_sample[0]


def test_a_path_a_record_lacks_is_refused_by_name() -> None:
    with pytest.raises(FeatureError, match=r"\['reply_asks'\].*cannot be computed from a trace"):
        registry.check_table(synthetic_trace(n_conversations=5), ("log_turn", "reply_asks"))
    with pytest.raises(FeatureError, match=r"\['log_turn'\].*text training sample"):
        sample_matrix([], ("log_turn",))
    with pytest.raises(FeatureError, match="unknown feature 'log_shoe_size'"):
        sample_matrix([], ("log_shoe_size",))
    assert "reply_asks" not in default_feature_names(["type"])
