"""`Predictor`: batching, agreement between paths, compatibility checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from predictor.artifact import DimensionMismatchError, EmbedderMismatchError, load_artifact
from predictor.features import ConversationWindow, encode_turn_counts
from predictor.model import mlp_inputs
from predictor.predictor import Predictor, RowwiseMLP, sigmoid
from tests.predictor.fakes import HashingEmbedder

WINDOWS = [
    ConversationWindow.from_prompts("a", ["hello", "how do I cache prefixes?"]),
    ConversationWindow("b", ("tell me a joke",), 1),
    ConversationWindow("c", tuple(f"question {i} about kv blocks" for i in range(9)), 12),
]


def test_predict_batches_embedding_calls(tiny_artifact: Path, hashing_embedder: HashingEmbedder):
    predictor = Predictor.load(tiny_artifact, embedder=hashing_embedder)
    probabilities = predictor.predict(WINDOWS)
    assert probabilities.shape == (3,) and probabilities.dtype == np.float64
    assert np.all((probabilities > 0) & (probabilities < 1))
    assert hashing_embedder.calls == [3]
    assert predictor.base_rate == 0.4
    assert predictor.predict([]).shape == (0,)


def test_predict_matches_torch_model_and_cached_embeddings(tiny_artifact, hashing_embedder):
    predictor = Predictor.load(tiny_artifact, embedder=hashing_embedder)
    probabilities = predictor.predict(WINDOWS)
    embeddings = hashing_embedder.embed(predictor.window_texts(WINDOWS))
    turns = [w.turn_count for w in WINDOWS]
    assert np.array_equal(predictor.predict_from_embeddings(embeddings, turns), probabilities)
    model = load_artifact(tiny_artifact).model
    with torch.inference_mode():
        logits = model(mlp_inputs(embeddings, encode_turn_counts(turns, predictor.feature_config)))
    np.testing.assert_allclose(probabilities, torch.sigmoid(logits).numpy(), rtol=1e-5)


def test_each_probability_depends_on_its_own_window_only(tiny_artifact, hashing_embedder):
    predictor = Predictor.load(tiny_artifact, embedder=hashing_embedder)
    together = predictor.predict(WINDOWS)
    alone = np.concatenate([predictor.predict([w]) for w in WINDOWS])
    assert np.array_equal(together, alone)
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(50, 32)).astype(np.float32)
    turns = rng.integers(1, 30, size=50)
    batch = predictor.predict_from_embeddings(embeddings, turns)
    rows = [
        predictor.predict_from_embeddings(embeddings[i : i + 1], turns[i : i + 1])[0]
        for i in range(50)
    ]
    assert np.array_equal(batch, np.array(rows))


def test_turn_count_matters(tiny_artifact, hashing_embedder):
    predictor = Predictor.load(tiny_artifact, embedder=hashing_embedder)
    first = predictor.predict([ConversationWindow("x", ("same text",), 1)])
    later = predictor.predict([ConversationWindow("x", ("same text",), 40)])
    assert first[0] != later[0]


def test_incompatible_embedders_are_refused(tiny_artifact: Path):
    with pytest.raises(EmbedderMismatchError):
        Predictor.load(tiny_artifact, embedder=HashingEmbedder(embedder_id="other"))
    with pytest.raises(DimensionMismatchError):
        Predictor(load_artifact(tiny_artifact), HashingEmbedder(dim=16))


def test_predict_from_embeddings_validates_shapes(tiny_artifact, hashing_embedder):
    predictor = Predictor.load(tiny_artifact, embedder=hashing_embedder)
    with pytest.raises(ValueError, match="shape"):
        predictor.predict_from_embeddings(np.zeros((2, 8)), [1, 2])
    with pytest.raises(ValueError, match="turn counts"):
        predictor.predict_from_embeddings(np.zeros((2, 32)), [1])


def test_rowwise_mlp_ignores_batch_neighbours(tiny_artifact):
    mlp = RowwiseMLP(load_artifact(tiny_artifact).model)
    x = np.random.default_rng(1).normal(size=(9, 33)).astype(np.float32)
    assert np.array_equal(mlp.logits(x)[3:5], mlp.logits(x[3:5]))


def test_sigmoid_is_stable():
    values = sigmoid(np.array([-1000.0, 0.0, 1000.0]))
    assert values.tolist() == [0.0, 0.5, 1.0]
