"""The A/B harness's learned source: same windows and embeddings as training, batched."""

from __future__ import annotations

import numpy as np
import pytest

from lpc.chat.conversation_workload import PREDICTOR_WINDOW
from lpc.replay.learned_source import LearnedSource
from lpc.workload import ScriptedTurn
from predictor.artifact import save_artifact
from predictor.predictor import Predictor
from tests.training.test_training_pipeline import FAST
from training.data import split_samples
from training.embedding_cache import EmbedOptions, EmbedStats
from training.fit import FitConfig
from training.pipeline import TrainConfig, predict_samples, sample_embeddings, train_predictor

QUIET = EmbedOptions(progress=False)


def scripted(conversation, turn_index: int) -> ScriptedTurn:
    prompts = conversation.user_prompts()
    start = max(0, turn_index + 1 - PREDICTOR_WINDOW)
    return ScriptedTurn(
        conversation.conversation_id,
        turn_index,
        [1, 2, 3],
        2,
        turn_index + 1 < len(prompts),
        tuple(prompts[start : turn_index + 1]),
    )


def harness_turns(conversations):
    return [scripted(c, k) for c in conversations for k in range(c.num_user_turns)]


def test_predictions_match_training_and_reuse_its_embeddings(
    tmp_path, conversations, embedder, cache
):
    outcome = train_predictor(conversations, FAST, embedder, cache, QUIET, log=lambda m: None)
    save_artifact(tmp_path / "m", outcome.artifact.model, outcome.artifact.metadata)
    predictor = Predictor.load(tmp_path / "m", embedder=embedder)
    split = split_samples(conversations, 5)
    evaluation = [
        c
        for c in conversations
        if c.conversation_id in {s.conversation_id for s in split.evaluation}
    ]
    source = LearnedSource(predictor, cache, QUIET)
    turns = harness_turns(evaluation)
    before = len(embedder.texts_seen)
    probabilities = source.predict(turns)
    assert len(embedder.texts_seen) == before  # every window was cached by training
    assert source.stats.windows_cached == len(turns)
    expected = predict_samples(
        predictor,
        sample_embeddings(cache, split.evaluation, predictor.feature_config, QUIET),
        split.evaluation,
    )
    assert np.allclose(probabilities, expected)
    assert source.predict([]) == []


def test_finish_features_come_from_the_loaded_conversations(
    tmp_path, conversations, embedder, cache
):
    config = TrainConfig(
        hidden_sizes=(16,), finish_features=("log_context_chars",), fit=FitConfig(max_epochs=1)
    )
    outcome = train_predictor(
        conversations[:100], config, embedder, cache, QUIET, log=lambda m: None
    )
    save_artifact(tmp_path / "m", outcome.artifact.model, outcome.artifact.metadata)
    predictor = Predictor.load(tmp_path / "m", embedder=embedder)
    turns = harness_turns(conversations[:5])
    with_conversations = LearnedSource(
        predictor, cache, QUIET, {c.conversation_id: c for c in conversations[:5]}
    )
    assert len(with_conversations.predict(turns)) == len(turns)
    without = LearnedSource(predictor, cache, QUIET)
    with pytest.raises(ValueError, match="finish-time features"):
        without.predict(turns)


def test_a_wider_window_than_the_turns_carry_is_rebuilt(tmp_path, conversations, embedder, cache):
    from predictor.features import FeatureConfig

    config = TrainConfig(
        hidden_sizes=(16,),
        fit=FitConfig(max_epochs=1),
        feature_config=FeatureConfig(num_previous_prompts=7),
    )
    outcome = train_predictor(
        conversations[:100], config, embedder, cache, QUIET, log=lambda m: None
    )
    save_artifact(tmp_path / "m", outcome.artifact.model, outcome.artifact.metadata)
    predictor = Predictor.load(tmp_path / "m", embedder=embedder)
    long = next(c for c in conversations if c.num_user_turns == 7)
    turns = harness_turns([long])
    source = LearnedSource(predictor, cache, QUIET, {long.conversation_id: long})
    stats = EmbedStats()
    got = source.predict(turns)
    windows = [tuple(long.user_prompts()[: k + 1][-8:]) for k in range(7)]
    direct = predictor.predict_from_embeddings(
        cache.embeddings_for(windows, predictor.feature_config, QUIET, stats), range(1, 8)
    )
    assert np.allclose(got, direct)


def test_token_features_come_with_every_replayed_turn(tmp_path, conversations, embedder, cache):
    from tests.training.test_training_pipeline import LengthCounter

    config = TrainConfig(
        hidden_sizes=(16,),
        finish_features=("log_request_tokens", "log_output_tokens"),
        fit=FitConfig(max_epochs=1),
    )
    outcome = train_predictor(
        conversations[:100],
        config,
        embedder,
        cache,
        QUIET,
        log=lambda m: None,
        token_counter=LengthCounter(),
    )
    save_artifact(tmp_path / "m", outcome.artifact.model, outcome.artifact.metadata)
    predictor = Predictor.load(tmp_path / "m", embedder=embedder)
    turn = scripted(conversations[0], 0)
    turn.token_ids = list(range(50))
    turn.num_prompt_tokens = 40
    source = LearnedSource(predictor, cache, QUIET)  # no conversations needed
    got = source.predict([turn])[0]
    expected = predictor.predict_from_embeddings(
        cache.embeddings_for([turn.user_prompts], predictor.feature_config, QUIET),
        [1],
        np.log1p(np.array([[50.0, 10.0]], dtype=np.float32)),
    )[0]
    assert got == pytest.approx(expected)


def test_serving_token_counts_are_the_replayed_request_sizes():
    from lpc.chat.conversation_workload import scripted_turns
    from lpc.chat.token_cache import tokenize_conversations_cached
    from lpc.chat.tokenizers import default_chat_tokenizer
    from lpc.replay.learned_source import ServingTokenCounter
    from tests.training.synthetic import synthetic_conversations

    conversations = synthetic_conversations(6, seed=3)
    counter = ServingTokenCounter(progress=False)
    counts = counter(conversations)
    tokenized = tokenize_conversations_cached(
        conversations, default_chat_tokenizer(), progress=False
    )
    for conversation, tokens in zip(conversations, tokenized.conversations, strict=True):
        for turn in scripted_turns(conversation, tokens):
            assert counts[(turn.conversation_id, turn.turn_index)] == (
                len(turn.token_ids),
                turn.num_output_tokens,
            )
    assert "chatml" in counter.name
