"""A registry that cannot be written (issue 44, case 11): `lpc retrain --registry <read-only>`
is refused before the training in one line naming the folder, the registry's lock names its
file instead of a PermissionError traceback, and a full disk while publishing leaves no
half-written version."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from lpc.cli.main import main
from predictor import atomic_files
from predictor.atomic_files import OutputWriteError
from training.model_registry import ModelRegistry, RegistryError

READ_ONLY = f"Read-only file system (errno {errno.EROFS})"


def read_only_folder(folder: Path, monkeypatch) -> Path:
    """chmod 0o555; as root (who writes anyway) writes below `folder` fail as on a read-only
    mount: the pre-flight's probe, and the opening of a file there."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        probe, open_path = atomic_files._probe, Path.open

        def refuse(where: Path) -> None:
            if where == folder:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS))
            probe(where)

        def open_refusing(path: Path, mode: str = "r", *args, **kwargs):
            if path.parent == folder and mode != "r":
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return open_path(path, mode, *args, **kwargs)

        monkeypatch.setattr(atomic_files, "_probe", refuse)
        monkeypatch.setattr(Path, "open", open_refusing)
    return folder


@pytest.fixture
def registry(tmp_path: Path, monkeypatch):
    folder = read_only_folder(tmp_path / "registry", monkeypatch)
    yield folder
    folder.chmod(0o755)


def test_retrain_refuses_a_read_only_registry_before_training(
    tmp_path: Path, registry: Path, capsys
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    assert main(["retrain", "--logs", str(logs), "--registry", str(registry)]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip() == f"lpc retrain: error: --registry: cannot write into {registry}: {READ_ONLY}"
    )


def test_the_return_registry_is_checked_too(tmp_path: Path, monkeypatch, capsys) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    returns = read_only_folder(tmp_path / "returns", monkeypatch)
    try:
        args = ["--registry", str(tmp_path / "registry"), "--return-registry", str(returns)]
        assert main(["retrain", "--logs", str(logs), *args]) == 2
    finally:
        returns.chmod(0o755)
    err = capsys.readouterr().err
    assert err.strip() == (
        f"lpc retrain: error: --return-registry: cannot write into {returns}: {READ_ONLY}"
    )
    assert not (tmp_path / "registry").exists(), "the pre-flight left a folder behind"


def test_the_lock_of_a_read_only_registry_names_its_file(registry: Path) -> None:
    with pytest.raises(RegistryError) as caught, ModelRegistry(registry).lock():
        pass
    lock = re.escape(str(registry / ".lock"))
    assert re.fullmatch(
        rf"registry {re.escape(str(registry))} cannot be locked: cannot write {lock}: "
        r"(Read-only file system \(errno 30\)|Permission denied \(errno 13\))",
        str(caught.value),
    ), str(caught.value)


def test_a_full_disk_while_publishing_leaves_no_version(tmp_path: Path, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    from predictor.artifact import ArtifactMetadata
    from predictor.features import FeatureConfig
    from predictor.model import ContinuationMLP, MLPConfig

    config = MLPConfig(embedding_dim=8, hidden_sizes=(4,))
    torch.manual_seed(0)
    model, metadata = ContinuationMLP(config), ArtifactMetadata("e", FeatureConfig(), config, 0.5)

    def full_disk(path: Path, payload: bytes) -> None:
        path.write_bytes(payload[: len(payload) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic_files, "_write_synced", full_disk)
    registry = ModelRegistry(tmp_path / "registry")
    with pytest.raises(OutputWriteError, match=r"cannot write .*model\.safetensors: No space left"):
        registry.publish(model, metadata)
    assert registry.versions() == [] and list(registry.root.iterdir()) == []


def test_a_malformed_notify_url_is_refused_before_training(tmp_path: Path, capsys) -> None:
    """A sibling of issue 44's case 12: the URL the daily job notifies `lpc serve` at was
    only tried after the training, and its httpx.InvalidURL became a warning."""
    logs = tmp_path / "logs"
    logs.mkdir()
    args = ["--registry", str(tmp_path / "registry"), "--notify-url", "http://127.0.0.1:notaport"]
    assert main(["retrain", "--logs", str(logs), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lpc retrain: error: --notify-url is not a valid URL ("), err
    assert err.endswith("got 'http://127.0.0.1:notaport'") and "\n" not in err


def test_the_daily_jobs_config_parses_its_notify_url(tmp_path: Path) -> None:
    from predictor.errors import InvalidInputError
    from training.retrain import RetrainConfig

    with pytest.raises(InvalidInputError, match=r"^RetrainConfig\.notify_url is not a valid URL"):
        RetrainConfig(tmp_path, tmp_path / "r", tmp_path / "c", notify_url="http://h:notaport")
