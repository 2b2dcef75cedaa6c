"""End to end: train on the training half, score on the evaluation half, serve the same."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.artifact import load_artifact, save_artifact
from predictor.predictor import Predictor
from training.data import split_samples
from training.embedding_cache import EmbedOptions
from training.fit import FitConfig
from training.pipeline import TrainConfig, evaluate_artifact, sample_embeddings, train_predictor
from training.samples import conversation_samples

QUIET = EmbedOptions(progress=False)
FAST = TrainConfig(
    hidden_sizes=(32, 32), fit=FitConfig(max_epochs=8, batch_size=64, learning_rate=1e-2)
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, conversations):
    from tests.predictor.fakes import HashingEmbedder
    from training.embedding_cache import EmbeddingCache

    embedder = HashingEmbedder(dim=32)
    cache = EmbeddingCache.open(
        tmp_path_factory.mktemp("cache"), embedder.embedder_id, embedder.dim, embedder=embedder
    )
    outcome = train_predictor(conversations, FAST, embedder, cache, QUIET, log=lambda m: None)
    return outcome, embedder, cache


def test_metrics_beat_the_turns_only_ablation(trained):
    outcome, _, _ = trained
    evaluation = outcome.metrics["evaluation"]
    ablation = outcome.metrics["turns_ablation"]
    assert evaluation["samples"] == len(outcome.split.evaluation)
    assert evaluation["mcc"] > 0.5 and evaluation["roc_auc"] > 0.8
    assert evaluation["mcc"] > ablation["majority"]["mcc"] + 0.3
    assert set(evaluation) >= {"mcc", "macro_f1", "roc_auc", "brier", "brier_prior_corrected"}
    assert outcome.metrics["fit"]["epochs_run"] <= 8


def test_training_never_sees_the_evaluation_half(trained, conversations):
    outcome, _, _ = trained
    split = split_samples(conversations, 5)
    assert outcome.artifact.metadata.training_data_fingerprint == split.fingerprint()
    assert not {s.split_key for s in outcome.split.training_half} & {
        s.split_key for s in outcome.split.evaluation
    }
    data = outcome.metrics["data"]
    assert data["train_samples"] + data["validation_samples"] == len(split.training_half)


def test_saved_artifact_serves_the_numbers_it_reports(tmp_path, trained):
    outcome, embedder, cache = trained
    metadata = save_artifact(tmp_path / "model", outcome.artifact.model, outcome.artifact.metadata)
    assert metadata.base_rate == pytest.approx(
        np.mean([s.label for s in outcome.split.training_half])
    )
    predictor = Predictor.load(tmp_path / "model", embedder=embedder)
    samples = outcome.split.evaluation[:40]
    served = predictor.predict([s.predictor_window() for s in samples])
    cached = predictor.predict_from_embeddings(
        sample_embeddings(cache, samples, predictor.feature_config, QUIET),
        [s.turn_count for s in samples],
    )
    assert np.allclose(served, cached, atol=1e-6)
    metrics = evaluate_artifact(
        tmp_path / "model", outcome.split.evaluation, cache, QUIET, embedder
    )
    assert metrics["mcc"] == pytest.approx(outcome.metrics["evaluation"]["mcc"])
    assert (
        load_artifact(tmp_path / "model").metadata.metrics["evaluation"]
        == outcome.metrics["evaluation"]
    )


def test_finish_features_are_recorded_and_required(tmp_path, trained, conversations):
    _, embedder, cache = trained
    config = TrainConfig(
        hidden_sizes=(16,),
        finish_features=("log_reply_chars", "reply_asks"),
        fit=FitConfig(max_epochs=1),
    )
    outcome = train_predictor(
        conversations[:200], config, embedder, cache, QUIET, log=lambda m: None
    )
    mlp = outcome.artifact.metadata.mlp_config
    assert mlp.extra_features == ("log_reply_chars", "reply_asks")
    assert mlp.input_dim == embedder.dim + 3
    save_artifact(tmp_path / "m", outcome.artifact.model, outcome.artifact.metadata)
    predictor = Predictor.load(tmp_path / "m", embedder=embedder)
    with pytest.raises(ValueError, match="finish-time features"):
        predictor.predict([outcome.split.evaluation[0].predictor_window()])


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="finish_features"):
        TrainConfig(finish_features=("reply_sentiment",))
    with pytest.raises(ValueError, match="validation_fraction"):
        TrainConfig(validation_fraction=1.0)


class LengthCounter:
    """A stand-in serving tokenizer: one token per character, requests grow turn by turn."""

    name = "test-characters"

    def __call__(self, conversations):
        counts = {}
        for c in conversations:
            for s in conversation_samples(c, 1):
                counts[(c.conversation_id, s.turn_count - 1)] = (s.context_chars, len(s.reply))
        return counts


def test_token_features_need_a_counter_and_record_it(trained, conversations):
    _, embedder, cache = trained
    config = TrainConfig(
        hidden_sizes=(16,), finish_features=("log_request_tokens",), fit=FitConfig(max_epochs=1)
    )
    with pytest.raises(ValueError, match="pass a token counter"):
        train_predictor(conversations[:200], config, embedder, cache, QUIET, log=lambda m: None)
    outcome = train_predictor(
        conversations[:200],
        config,
        embedder,
        cache,
        QUIET,
        log=lambda m: None,
        token_counter=LengthCounter(),
    )
    notes = outcome.artifact.metadata.notes
    assert notes["serving_tokenizer"] == "test-characters"
    assert notes["samples_without_token_counts"] == 0
    assert all(s.request_tokens == s.context_chars for s in outcome.split.evaluation)
