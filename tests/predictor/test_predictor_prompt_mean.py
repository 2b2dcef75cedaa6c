"""The cheaper `prompt_mean` window encoding: per-prompt vectors, cached across turns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from predictor.features import ConversationWindow, FeatureConfig, windows_for_conversation
from predictor.predictor import Predictor
from predictor.prompt_cache import PromptEmbeddingCache
from tests.predictor.conftest import make_artifact
from tests.predictor.fakes import HashingEmbedder

MODE = FeatureConfig(window_encoding="prompt_mean")


@pytest.fixture
def mean_artifact(tmp_path: Path) -> Path:
    folder = tmp_path / "mean"
    make_artifact(folder, feature_config=MODE)
    return folder


def test_fingerprints():
    assert FeatureConfig().fingerprint() == "316ac0b9cb3cdfe7"  # unchanged by the new field
    assert MODE.fingerprint() != FeatureConfig().fingerprint()
    assert FeatureConfig.from_dict(MODE.to_dict()) == MODE
    with pytest.raises(ValueError, match="window_encoding"):
        FeatureConfig(window_encoding="concat")


def test_each_turn_embeds_only_its_new_prompt(mean_artifact):
    embedder = HashingEmbedder()
    predictor = Predictor.load(mean_artifact, embedder=embedder)
    prompts = [f"turn {i} asks about topic {i % 3}" for i in range(8)]
    for window in windows_for_conversation("c", prompts, keep_last=5):
        predictor.predict([window])
    assert embedder.texts_seen == prompts  # every prompt embedded exactly once
    assert predictor.prompt_cache.stats.hits == sum(min(t, 5) - 1 for t in range(1, 9))


def test_window_vector_is_the_normalised_mean_of_prompt_vectors(mean_artifact):
    embedder = HashingEmbedder()
    predictor = Predictor.load(mean_artifact, embedder=embedder)
    window = ConversationWindow("c", tuple(f"p{i} words here" for i in range(7)), 9)
    vectors = np.stack([embedder.embed_one(p) for p in window.user_prompts[-5:]])
    mean = vectors.mean(axis=0)
    expected = mean / np.linalg.norm(mean)
    np.testing.assert_allclose(predictor.embed_windows([window])[0], expected, rtol=1e-6)
    probability = predictor.predict_from_embeddings(expected[None, :], [9])
    np.testing.assert_allclose(predictor.predict([window]), probability, rtol=1e-6)


def test_long_prompts_are_cut_to_one_share(mean_artifact):
    embedder = HashingEmbedder()
    predictor = Predictor.load(mean_artifact, embedder=embedder)
    long_prompt = " ".join(f"w{i}" for i in range(1000))
    predictor.predict([ConversationWindow.from_prompts("c", [long_prompt])])
    (text,) = embedder.texts_seen
    assert len(text.split()) == (512 - 3) // 5


def test_joined_mode_has_no_cache(tiny_artifact):
    assert Predictor.load(tiny_artifact, embedder=HashingEmbedder()).prompt_cache is None


def test_cache_is_bounded_lru():
    cache = PromptEmbeddingCache(max_entries=2)
    cache.put("a", np.zeros(2))
    cache.put("b", np.ones(2))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", np.ones(2))
    assert cache.get("b") is None and cache.get("a") is not None and len(cache) == 2
    assert cache.stats.evictions == 1
