"""The text model's registered features from the request: windows carry `prompt_tokens`,
`Predictor.predict` computes the features with the same registry records training reads, and
refuses what a request cannot supply."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from predictor.access_features import (
    FEATURES_BY_NAME,
    MissingPromptTokensError,
    UnservableFeaturesError,
    computable_on,
    not_computable,
    sample_matrix,
    window_matrix,
)
from predictor.artifact import load_artifact
from predictor.features import ConversationWindow
from predictor.predictor import Predictor
from tests.predictor.conftest import make_artifact, token_windows, turn_sample
from tests.predictor.fakes import HashingEmbedder
from tests.predictor.light_imports import assert_imports_light


def test_windows_carry_prompt_tokens_strictly():
    window = ConversationWindow("c", ("hi",), 1, 17)
    assert window.to_dict() == {
        "conversation_id": "c",
        "user_prompts": ["hi"],
        "turn_count": 1,
        "prompt_tokens": 17,
    }
    assert "prompt_tokens" not in ConversationWindow("c", ("hi",), 1).to_dict()
    assert ConversationWindow("c", ("hi",), 1, 0).prompt_tokens == 0
    for bad, error in [(True, TypeError), (3.0, TypeError), ("3", TypeError), (-1, ValueError)]:
        with pytest.raises(error, match="prompt_tokens"):
            ConversationWindow("c", ("hi",), 1, bad)


@pytest.mark.parametrize(
    "names",
    [("log_prompt_tokens",), ("log_prompt_chars",), ("log_prompt_chars", "log_prompt_tokens")],
)
def test_serving_computes_exactly_what_training_computes(names):
    windows = [*token_windows(40, seed=2), ConversationWindow("empty", ("a", ""), 2, 0)]
    served = window_matrix(windows, names)
    trained = sample_matrix([turn_sample(w) for w in windows], names)
    assert served.dtype == trained.dtype == np.float32
    assert np.array_equal(served, trained)


def test_every_request_feature_is_a_training_feature():
    served, trained = computable_on("window"), computable_on("sample")
    assert set(served) == {"log_prompt_tokens", "log_prompt_chars"}
    assert set(served) <= set(trained)
    # log_request_tokens counts prompt + output: known only at finish, like the reply.
    assert not_computable(trained, "window") == tuple(n for n in trained if n not in served)
    assert "log_request_tokens" in not_computable(trained, "window")
    # what a request carries is known before the request finishes; the rest is not
    assert all(FEATURES_BY_NAME[n].known_at == "arrival" for n in served)
    assert {FEATURES_BY_NAME[n].known_at for n in trained if n not in served} == {"release"}


def test_missing_prompt_tokens_are_named_before_anything_is_embedded(tmp_path):
    make_artifact(tmp_path / "m", extra_features=("log_prompt_tokens",))
    embedder = HashingEmbedder()
    predictor = Predictor.load(tmp_path / "m", embedder=embedder)
    assert predictor.needs_prompt_tokens and predictor.unservable_features == ()
    windows = [ConversationWindow("has", ("a",), 1, 5), ConversationWindow("lacks", ("b",), 1)]
    with pytest.raises(MissingPromptTokensError, match=r"1 \('lacks'\)"):
        predictor.predict(windows)
    assert embedder.calls == []


def test_predict_equals_the_training_path_and_reads_prompt_tokens(prompt_tokens_artifact):
    embedder = HashingEmbedder()
    predictor = Predictor.load(prompt_tokens_artifact, embedder=embedder)
    windows = token_windows(30, seed=5)
    served = predictor.predict(windows)
    extras = sample_matrix([turn_sample(w) for w in windows], predictor.extra_features)
    embeddings = embedder.embed(predictor.window_texts(windows))
    expected = predictor.predict_from_embeddings(
        embeddings, [w.turn_count for w in windows], extras
    )
    assert np.array_equal(served, expected)
    # The model learnt "short requests continue": same windows, only the count differs.
    short = predictor.predict([replace(w, prompt_tokens=50) for w in windows])
    long = predictor.predict([replace(w, prompt_tokens=40_000) for w in windows])
    assert np.all(short > long) and short.mean() > 0.8 and long.mean() < 0.2


def test_a_model_without_extra_features_ignores_prompt_tokens(tiny_artifact):
    predictor = Predictor.load(tiny_artifact, embedder=HashingEmbedder())
    assert not predictor.needs_prompt_tokens
    windows = token_windows(10, seed=1)
    bare = [ConversationWindow(w.conversation_id, w.user_prompts, w.turn_count) for w in windows]
    assert np.array_equal(predictor.predict(windows), predictor.predict(bare))


def test_features_known_only_at_finish_are_refused_by_name(tmp_path):
    make_artifact(tmp_path / "m", extra_features=("log_prompt_tokens", "log_output_tokens"))
    predictor = Predictor(load_artifact(tmp_path / "m"), HashingEmbedder())
    assert predictor.unservable_features == ("log_output_tokens",)
    with pytest.raises(UnservableFeaturesError, match=r"\['log_output_tokens'\]"):
        predictor.check_servable()
    with pytest.raises(UnservableFeaturesError, match="finish-time features"):
        predictor.predict([ConversationWindow("c", ("a",), 1, 3)])
    # predict_from_embeddings still takes them, computed by the caller (training, A/B).
    probabilities = predictor.predict_from_embeddings(np.zeros((1, 32)), [1], np.ones((1, 2)))
    assert probabilities.shape == (1,)


def test_the_feature_registry_stays_light_to_import():
    """The records are shared by training, serving and the plugin; importing them must not
    pull in torch (nor the server's or training's packages)."""
    assert_imports_light("predictor.access_features", ("torch", "pydantic", "fastapi", "training"))
