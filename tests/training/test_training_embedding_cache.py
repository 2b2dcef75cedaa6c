"""The embedding cache: computed once, reused, resumable, never stale."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from predictor.features import ConversationWindow, FeatureConfig, WindowTextBuilder
from tests.predictor.fakes import HashingEmbedder
from training.embedding_cache import (
    EmbeddingCache,
    EmbeddingCacheError,
    EmbedOptions,
    EmbedStats,
)

QUIET = EmbedOptions(progress=False, chunk_windows=8)


def windows(count: int, long: bool = False) -> list[tuple[str, ...]]:
    body = " ".join(f"w{j}" for j in range(400)) if long else "short prompt"
    return [tuple(f"prompt {i} {k} {body}" for k in range(1 + i % 3)) for i in range(count)]


def test_vectors_are_the_embedding_of_the_window_text(cache, embedder):
    config = FeatureConfig()
    data = windows(5)
    vectors = cache.embeddings_for(data, config, QUIET)
    builder = WindowTextBuilder(config, embedder.tokenizer, embedder.max_input_tokens)
    texts = builder.build([ConversationWindow("x", w, len(w)) for w in data])
    assert np.allclose(vectors, np.stack([embedder.embed_one(t) for t in texts]))


def test_second_call_and_second_process_embed_nothing(tmp_path, cache, embedder):
    config = FeatureConfig()
    first = cache.embeddings_for(windows(20), config, QUIET)
    texts_seen = len(embedder.texts_seen)
    stats = EmbedStats()
    again = cache.embeddings_for(windows(20), config, QUIET, stats)
    assert np.array_equal(first, again)
    assert stats.windows_cached == 20 and stats.texts_embedded == 0

    reopened = EmbeddingCache.open(tmp_path / "cache", embedder.embedder_id, embedder.dim)
    assert np.array_equal(reopened.embeddings_for(windows(20), config, QUIET), first)
    assert len(embedder.texts_seen) == texts_seen  # nothing embedded again


def test_only_the_last_window_size_prompts_matter(cache):
    config = FeatureConfig(num_previous_prompts=1)
    a = cache.embeddings_for([("old", "x", "y")], config, QUIET)
    b = cache.embeddings_for([("other old", "x", "y")], config, QUIET)
    assert np.array_equal(a, b)


def test_feature_config_change_reuses_identical_texts_only(cache, embedder):
    short = windows(6)
    long = windows(6, long=True)
    cache.embeddings_for(short + long, FeatureConfig(), QUIET)
    stats = EmbedStats()
    redistributed = FeatureConfig(share_policy="redistribute")
    vectors = cache.embeddings_for(short + long, redistributed, QUIET, stats)
    # short windows fit either way (same text, same vector); long ones now get more tokens
    assert stats.texts_embedded == len(long)
    builder = WindowTextBuilder(redistributed, embedder.tokenizer, embedder.max_input_tokens)
    texts = builder.build([ConversationWindow("x", w, len(w)) for w in short + long])
    assert np.allclose(vectors, np.stack([embedder.embed_one(t) for t in texts]))


class ChangedEmbedder(HashingEmbedder):
    """Same id and size as the fake embedder, another function: new weights in one folder."""

    def embed_one(self, text: str) -> np.ndarray:
        return np.roll(super().embed_one(text), 1)


def test_an_embedder_changed_behind_the_same_id_retires_the_cache(tmp_path, cache, embedder):
    config = FeatureConfig()
    old = cache.embeddings_for(windows(4), config, QUIET)
    changed = ChangedEmbedder(dim=embedder.dim)
    reopened = EmbeddingCache.open(
        tmp_path / "cache", changed.embedder_id, changed.dim, embedder=changed
    )
    new = reopened.embeddings_for(windows(4), config, QUIET)
    assert not np.allclose(old, new)
    assert np.allclose(new, np.roll(old, 1, axis=1))
    assert list((tmp_path / "cache" / "v1").glob("*.stale-*"))


def test_verify_on_open_catches_a_change_without_missing_vectors(tmp_path, cache, embedder):
    cache.embeddings_for(windows(3), FeatureConfig(), QUIET)
    changed = ChangedEmbedder(dim=embedder.dim)
    lazy = EmbeddingCache.open(
        tmp_path / "cache",
        changed.embedder_id,
        changed.dim,
        embedder_factory=lambda: changed,
        verify=True,
    )
    assert len(lazy.vectors) == 0


class FailingEmbedder(HashingEmbedder):
    """Dies (like a killed job) after a number of embed calls."""

    def __init__(self, fail_after: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_after = fail_after

    def embed(self, texts, batch_size=32):
        if len(self.calls) > self.fail_after:  # the probe is call 0
            raise KeyboardInterrupt
        return super().embed(texts, batch_size)


def test_an_interrupted_run_resumes_where_it_stopped(tmp_path):
    failing = FailingEmbedder(fail_after=2, dim=32)
    cache = EmbeddingCache.open(tmp_path / "c", failing.embedder_id, 32, embedder=failing)
    data = windows(40)
    with pytest.raises(KeyboardInterrupt):
        cache.embeddings_for(data, FeatureConfig(), QUIET)
    healthy = HashingEmbedder(dim=32)
    resumed = EmbeddingCache.open(tmp_path / "c", healthy.embedder_id, 32, embedder=healthy)
    stats = EmbedStats()
    vectors = resumed.embeddings_for(data, FeatureConfig(), QUIET, stats)
    assert stats.windows_cached == 16  # two chunks of 8 survived the interruption
    assert stats.texts_embedded == 24
    fresh = EmbeddingCache.open(tmp_path / "d", healthy.embedder_id, 32, embedder=healthy)
    assert np.allclose(vectors, fresh.embeddings_for(data, FeatureConfig(), QUIET))


def test_half_written_and_duplicate_shards_are_harmless(tmp_path, embedder):
    root = tmp_path / "c"
    a = EmbeddingCache.open(root, embedder.embedder_id, embedder.dim, embedder=embedder)
    b = EmbeddingCache.open(root, embedder.embedder_id, embedder.dim, embedder=embedder)
    first = a.embeddings_for(windows(10), FeatureConfig(), QUIET)
    b.embeddings_for(windows(10), FeatureConfig(), QUIET)  # b had loaded nothing: duplicates
    (a.folder / "vectors" / ".shard-1-2.arrow.tmp-99").write_bytes(b"half a shard")
    reader = EmbeddingCache.open(root, embedder.embedder_id, embedder.dim)
    assert np.array_equal(reader.embeddings_for(windows(10), FeatureConfig(), QUIET), first)


def test_missing_vectors_without_an_embedder_fail_clearly(tmp_path, embedder):
    reader = EmbeddingCache.open(tmp_path / "c", embedder.embedder_id, embedder.dim)
    with pytest.raises(EmbeddingCacheError, match="needs the embedder"):
        reader.embeddings_for(windows(1), FeatureConfig(), QUIET)


def test_namespaces_are_per_embedder(tmp_path, embedder):
    other = HashingEmbedder(dim=16, embedder_id="another-embedder")
    a = EmbeddingCache.open(tmp_path, embedder.embedder_id, embedder.dim, embedder=embedder)
    b = EmbeddingCache.open(tmp_path, other.embedder_id, other.dim, embedder=other)
    assert a.folder != b.folder
    assert b.embeddings_for(windows(2), FeatureConfig(), QUIET).shape == (2, 16)
    with pytest.raises(EmbeddingCacheError, match="does not match"):
        EmbeddingCache.open(tmp_path, "another-embedder", 32, embedder=other)


def test_several_devices_need_a_sentence_transformers_embedder(tmp_path, embedder):
    cache = EmbeddingCache.open(tmp_path, embedder.embedder_id, embedder.dim, embedder=embedder)
    with pytest.raises(EmbeddingCacheError, match="sentence-transformers"):
        cache.embeddings_for(
            windows(2), FeatureConfig(), EmbedOptions(progress=False, devices=("cpu", "cpu"))
        )


def test_options_are_validated():
    with pytest.raises(ValueError, match="batch_size"):
        EmbedOptions(batch_size=0)
    with pytest.raises(ValueError, match="devices"):
        EmbedOptions(devices=())


def test_cache_folder_layout(tmp_path: Path, cache):
    cache.embeddings_for(windows(3), FeatureConfig(), QUIET)
    assert (cache.folder / "namespace.json").is_file()
    assert list((cache.folder / "vectors").glob("shard-*.arrow"))
    index = cache.folder / "texts" / FeatureConfig().fingerprint()
    assert list(index.glob("part-*.arrow")) and (index / "feature_config.json").is_file()


@pytest.mark.slow
def test_a_multi_process_pool_gives_the_single_process_vectors(tmp_path, minilm_path):
    from predictor.embedders import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(minilm_path, device="cpu")
    data = windows(24, long=True)
    single = EmbeddingCache.open(
        tmp_path / "one", embedder.embedder_id, embedder.dim, embedder=embedder
    ).embeddings_for(data, FeatureConfig(), QUIET)
    pooled = EmbeddingCache.open(
        tmp_path / "pool", embedder.embedder_id, embedder.dim, embedder=embedder
    ).embeddings_for(data, FeatureConfig(), EmbedOptions(progress=False, devices=("cpu", "cpu")))
    assert np.allclose(single, pooled, atol=1e-5)


def test_prompt_mean_windows_are_what_the_predictor_serves(tmp_path, cache, embedder):
    from predictor.features import ConversationWindow
    from predictor.predictor import Predictor
    from tests.predictor.conftest import make_artifact

    config = FeatureConfig(window_encoding="prompt_mean")
    make_artifact(tmp_path / "m", dim=embedder.dim, feature_config=config)
    predictor = Predictor.load(tmp_path / "m", embedder=embedder)
    data = windows(9, long=True) + windows(4)
    served = predictor.embed_windows([ConversationWindow("x", w, len(w)) for w in data])
    stats = EmbedStats()
    cached = cache.embeddings_for(data, config, QUIET, stats)
    assert np.allclose(served, cached, atol=1e-6)
    assert stats.windows == len({p for w in data for p in w})  # one unit per distinct prompt
    again = EmbedStats()
    cache.embeddings_for(data[:3], config, QUIET, again)
    assert again.texts_embedded == 0
