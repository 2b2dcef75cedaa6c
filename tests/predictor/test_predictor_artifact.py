"""Artifacts: atomic save, verified load, one precise error per kind of problem."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from predictor import atomic_files
from predictor.artifact import (
    METADATA_FILE,
    WEIGHTS_FILE,
    ArtifactChecksumError,
    ArtifactCorruptError,
    ArtifactMetadata,
    ArtifactMissingError,
    ArtifactVersionError,
    DimensionMismatchError,
    EmbedderMismatchError,
    load_artifact,
    save_artifact,
)
from predictor.atomic_files import OutputWriteError
from predictor.features import FeatureConfig
from predictor.model import ContinuationMLP, MLPConfig, mlp_inputs
from tests.predictor.conftest import make_artifact


def test_round_trip_preserves_weights_and_metadata(tmp_path: Path):
    folder = tmp_path / "a"
    written = make_artifact(folder, feature_config=FeatureConfig(num_previous_prompts=2))
    loaded = load_artifact(
        folder, expected_embedder_id="test-hashing-embedder", expected_embedding_dim=32
    )
    assert loaded.metadata == written
    assert loaded.metadata.feature_config.num_previous_prompts == 2
    assert loaded.metadata.input_dim == 33
    assert len(written.weights_sha256) == 64 and written.weights_bytes > 0
    torch.manual_seed(0)
    reference = ContinuationMLP(MLPConfig(embedding_dim=32))
    for name, tensor in reference.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor)
    assert not loaded.model.training
    data = json.loads((folder / METADATA_FILE).read_text())
    for key in (
        "embedder_id",
        "feature_config",
        "input_dim",
        "base_rate",
        "metrics",
        "training_data_fingerprint",
        "format_version",
        "weights_sha256",
    ):
        assert key in data


def test_save_refuses_to_overwrite_unless_asked(tmp_path: Path):
    folder = tmp_path / "a"
    make_artifact(folder, seed=0)
    with pytest.raises(FileExistsError):
        make_artifact(folder, seed=1)
    old = load_artifact(folder).metadata.weights_sha256
    torch.manual_seed(1)
    model = ContinuationMLP(MLPConfig(embedding_dim=32))
    metadata = load_artifact(folder).metadata
    save_artifact(folder, model, metadata, overwrite=True)
    assert load_artifact(folder).metadata.weights_sha256 != old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no staging leftovers


def test_a_crash_while_writing_leaves_nothing_loadable(tmp_path: Path, monkeypatch):
    calls = []

    def failing_write(path: Path, payload: bytes) -> None:
        calls.append(path.name)
        if path.name == METADATA_FILE:
            raise OSError("disk full")
        path.write_bytes(payload)

    monkeypatch.setattr(atomic_files, "_write_synced", failing_write)
    with pytest.raises(OutputWriteError, match=f"cannot write .*{METADATA_FILE}: disk full"):
        make_artifact(tmp_path / "a", cached=False)
    assert calls == [WEIGHTS_FILE, METADATA_FILE]
    assert list(tmp_path.iterdir()) == []


def test_metrics_must_be_strict_json(tmp_path: Path):
    model = ContinuationMLP(MLPConfig(embedding_dim=4))
    metadata = ArtifactMetadata(
        "e", FeatureConfig(), MLPConfig(embedding_dim=4), 0.5, metrics={"mcc": float("nan")}
    )
    with pytest.raises(ValueError, match="NaN"):
        save_artifact(tmp_path / "a", model, metadata)


def test_metadata_validation():
    with pytest.raises(ValueError, match="base_rate"):
        ArtifactMetadata("e", FeatureConfig(), MLPConfig(), 1.5)
    with pytest.raises(ValueError, match="embedder_id"):
        ArtifactMetadata("", FeatureConfig(), MLPConfig(), 0.5)


def test_missing_folder_and_files(tmp_path: Path, tiny_artifact: Path):
    with pytest.raises(ArtifactMissingError, match="does not exist"):
        load_artifact(tmp_path / "nope")
    (tiny_artifact / WEIGHTS_FILE).unlink()
    with pytest.raises(ArtifactMissingError, match=WEIGHTS_FILE):
        load_artifact(tiny_artifact)
    (tiny_artifact / METADATA_FILE).unlink()
    with pytest.raises(ArtifactMissingError, match=METADATA_FILE):
        load_artifact(tiny_artifact)


def test_truncated_weights(tiny_artifact: Path):
    weights = tiny_artifact / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ArtifactCorruptError, match="truncated"):
        load_artifact(tiny_artifact)


def test_flipped_byte_fails_the_checksum(tiny_artifact: Path):
    weights = tiny_artifact / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactChecksumError, match="sha256"):
        load_artifact(tiny_artifact)


def test_unparsable_weights_with_matching_checksum(tiny_artifact: Path):
    garbage = b"\x00" * 64
    _rewrite_metadata(
        tiny_artifact,
        weights_bytes=len(garbage),
        weights_sha256=__import__("hashlib").sha256(garbage).hexdigest(),
    )
    (tiny_artifact / WEIGHTS_FILE).write_bytes(garbage)
    with pytest.raises(ArtifactCorruptError, match="cannot be parsed"):
        load_artifact(tiny_artifact)


def _rewrite_metadata(folder: Path, **changes) -> None:
    path = folder / METADATA_FILE
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_bad_json(tiny_artifact: Path):
    (tiny_artifact / METADATA_FILE).write_text("{not json")
    with pytest.raises(ArtifactCorruptError, match="not valid JSON"):
        load_artifact(tiny_artifact)


def test_unsupported_version(tiny_artifact: Path):
    _rewrite_metadata(tiny_artifact, format_version=99)
    with pytest.raises(ArtifactVersionError, match="format version 99"):
        load_artifact(tiny_artifact)


def test_missing_and_invalid_fields(tiny_artifact: Path):
    data = json.loads((tiny_artifact / METADATA_FILE).read_text())
    del data["base_rate"]
    (tiny_artifact / METADATA_FILE).write_text(json.dumps(data))
    with pytest.raises(ArtifactCorruptError, match="base_rate"):
        load_artifact(tiny_artifact)
    data["base_rate"] = 0.3
    data["feature_config"]["head_fraction"] = 7
    (tiny_artifact / METADATA_FILE).write_text(json.dumps(data))
    with pytest.raises(ArtifactCorruptError, match="head_fraction"):
        load_artifact(tiny_artifact)


def test_weights_that_do_not_match_the_recorded_shape(tiny_artifact: Path):
    data = json.loads((tiny_artifact / METADATA_FILE).read_text())
    data["mlp_config"]["embedding_dim"] = 64
    (tiny_artifact / METADATA_FILE).write_text(json.dumps(data))
    with pytest.raises(ArtifactCorruptError, match="do not match"):
        load_artifact(tiny_artifact)


def test_embedder_and_dimension_mismatch(tiny_artifact: Path):
    with pytest.raises(EmbedderMismatchError, match="test-hashing-embedder"):
        load_artifact(tiny_artifact, expected_embedder_id="other")
    with pytest.raises(DimensionMismatchError, match="32-dim"):
        load_artifact(tiny_artifact, expected_embedding_dim=384)


def test_mlp_shape_and_inputs():
    model = ContinuationMLP().eval()
    linears = [m for m in model.layers if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (385, 128),
        (128, 128),
        (128, 128),
        (128, 1),
    ]
    inputs = mlp_inputs(np.zeros((3, 384), np.float32), [0.5, 1.0, 2.0])
    assert inputs.shape == (3, 385) and inputs[2, 384] == 2.0
    assert model(inputs).shape == (3,)
    with pytest.raises(ValueError, match="385"):
        model(torch.zeros(2, 384))
    with pytest.raises(ValueError, match="hidden_sizes"):
        MLPConfig(hidden_sizes=(128, 0))
