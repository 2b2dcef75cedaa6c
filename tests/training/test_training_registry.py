"""The model registry: versions, the atomically switched `current`, history, lock, pruning."""

from __future__ import annotations

import os

import pytest
import torch

from predictor.artifact import ArtifactMetadata, load_artifact
from predictor.features import FeatureConfig
from predictor.model import ContinuationMLP, MLPConfig
from training.model_registry import ModelRegistry, RegistryError, RegistryLockedError


def model_and_metadata(seed: int) -> tuple[ContinuationMLP, ArtifactMetadata]:
    torch.manual_seed(seed)
    config = MLPConfig(embedding_dim=8, hidden_sizes=(4,))
    return ContinuationMLP(config), ArtifactMetadata("fake", FeatureConfig(), config, 0.7)


def test_publish_and_promote(tmp_path):
    registry = ModelRegistry(tmp_path / "reg")
    assert registry.versions() == [] and registry.current_path() is None
    v1 = registry.publish(*model_and_metadata(1), {"source": "test"})
    assert v1 == "v0001" and registry.current_version() is None
    registry.promote(v1)
    v2 = registry.publish(*model_and_metadata(2))
    assert registry.versions() == ["v0001", "v0002"]
    assert registry.current_version() == "v0001"
    registry.promote(v2)
    assert registry.current_path() == tmp_path / "reg" / "v0002"
    loaded = load_artifact(registry.current_link)  # the link loads like a folder
    assert loaded.metadata.notes["registry"]["published_at"]
    assert os.readlink(registry.current_link) == "v0002"  # relative: the folder can move


def test_promote_refuses_what_does_not_load(tmp_path):
    registry = ModelRegistry(tmp_path)
    version = registry.publish(*model_and_metadata(1))
    registry.promote(version)
    (tmp_path / "v0002").mkdir()
    with pytest.raises(Exception, match=r"metadata\.json"):
        registry.promote("v0002")
    assert registry.current_version() == version
    with pytest.raises(RegistryError, match="not a version name"):
        registry.promote("latest")


def test_history_and_state_round_trip(tmp_path):
    registry = ModelRegistry(tmp_path)
    registry.append_history({"event": "train", "version": "v0001"})
    registry.append_history({"event": "retrain", "status": "kept"})
    assert [e["event"] for e in registry.history()] == ["train", "retrain"]
    assert all("at" in e for e in registry.history())
    registry.save_state({"seen_files": ["a|1|2"]})
    assert registry.state() == {"seen_files": ["a|1|2"]}
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_prune_keeps_the_newest_and_the_current(tmp_path):
    registry = ModelRegistry(tmp_path)
    versions = [registry.publish(*model_and_metadata(i)) for i in range(5)]
    registry.promote(versions[0])
    assert registry.prune(keep=2) == ["v0002", "v0003"]
    assert registry.versions() == ["v0001", "v0004", "v0005"]


def test_staging_leftovers_are_never_versions_and_get_cleaned(tmp_path):
    registry = ModelRegistry(tmp_path)
    registry.publish(*model_and_metadata(1))
    (tmp_path / ".incoming-123-456").mkdir()
    (tmp_path / "..incoming-123-456.tmp-abc").mkdir()
    (tmp_path / ".current.tmp-1-2").symlink_to("v0001")
    assert registry.versions() == ["v0001"]
    assert sorted(registry.clean_staging()) == sorted(
        [".incoming-123-456", "..incoming-123-456.tmp-abc", ".current.tmp-1-2"]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v0001"]


def test_lock_is_exclusive_and_released(tmp_path):
    registry = ModelRegistry(tmp_path)
    with (
        registry.lock(),
        pytest.raises(RegistryLockedError, match="locked by another run"),
        ModelRegistry(tmp_path).lock(),
    ):
        pass
    with registry.lock():  # released on exit
        pass
