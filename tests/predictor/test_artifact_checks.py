"""One validation for every artifact loader: the replay (`lpc ab`), the vLLM plugin and
`lpc models check` refuse the same damaged artifacts with the same one line naming the file
and the field (issue 44, cases 2, 3, 10 and 15)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lpc.cli.main import main
from lpc.integrations.access_runtime import load_access_runtime
from lpc.integrations.config import PluginConfig, PluginConfigError
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_plugin import build_runtime
from lpc.replay.return_sources import load_return_model
from predictor.access_predictor import AccessPredictor
from predictor.artifact import ArtifactError, ArtifactMissingError
from predictor.artifact_checks import check_grid, check_standardisation
from predictor.artifact_kinds import KIND_ACCESS, KIND_RETURN, KIND_TEXT, artifact_kind
from predictor.return_time import (
    ReturnInput,
    ReturnModelMetadata,
    ReturnTimePredictor,
    save_return_model,
)
from tests.predictor.broken_artifacts import (
    SHIPPED_ACCESS,
    SHIPPED_RETURN,
    SHIPPED_TEXT,
    damaged_copy,
    setter,
)

NAN = float("nan")


def _swap_grid_points(data: dict[str, Any]) -> None:
    grid = data["grid_s"]
    grid[2], grid[3] = grid[3], grid[2]


# name -> (metadata edit, tensor to fill with NaN or None, drop the weights, words of the error)
RETURN_DAMAGES: dict[str, tuple[Callable | None, str | None, bool, tuple[str, ...]]] = {
    "grid_nan": (setter("grid_s", 3, value=NAN), None, False, ("grid_s[3]", "not finite")),
    "grid_unsorted": (_swap_grid_points, None, False, ("grid_s must increase", "grid_s[3]")),
    "grid_negative": (setter("grid_s", 1, value=-5.0), None, False, ("grid_s must increase",)),
    "grid_duplicated": (setter("grid_s", 2, value=5.0), None, False, ("grid_s must increase",)),
    "grid_nonzero_start": (setter("grid_s", 0, value=1.0), None, False, ("grid_s must start",)),
    "mean_nan": (setter("inputs", 0, "mean", value=NAN), None, False, ("'log_turn'", "mean")),
    "std_negative": (setter("inputs", 1, "std", value=-1.0), None, False, ("std must be > 0",)),
    "std_zero": (setter("inputs", 1, "std", value=0), None, False, ("std must be > 0, got 0",)),
    "time_origin_arrival": (
        setter("time_origin", value="arrival"),
        None,
        False,
        ("time_origin 'arrival' is not supported",),
    ),
    "known_at_arrival": (
        setter("known_at", value="arrival"),
        None,
        False,
        ("known_at 'arrival' is not supported",),
    ),
    "weights_nan": (None, "layers.0.weight", False, ("'layers.0.weight' holds NaN",)),
    "bias_nan": (None, "layers.2.bias", False, ("'layers.2.bias' holds NaN",)),
    "no_weights": (None, None, True, ("model.safetensors is missing",)),
    "unknown_feature": (setter("inputs", 0, "name", value="bogus"), None, False, ("'bogus'",)),
}


@pytest.fixture(scope="module")
def damaged_return_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("damaged-return")
    return {
        name: damaged_copy(SHIPPED_RETURN, root / name, edit, tensor, drop_weights=drop)
        for name, (edit, tensor, drop, _) in RETURN_DAMAGES.items()
    }


def _one_line(message: str, folder: Path, words: tuple[str, ...]) -> None:
    assert "\n" not in message, message
    assert str(folder) in message, message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("name", sorted(RETURN_DAMAGES))
def test_every_loader_refuses_a_damaged_return_model_alike(
    name: str, damaged_return_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = damaged_return_models[name]
    words = RETURN_DAMAGES[name][3]
    with pytest.raises(ArtifactError) as replay:  # what `lpc ab --return-model` loads with
        load_return_model(folder)
    _one_line(str(replay.value), folder, words)
    config = PluginConfig(evictor="lpc-return", return_model=str(folder), stats_log_interval_s=0.0)
    with pytest.raises(PluginConfigError) as plugin:  # never a ZeroDivisionError (case 10)
        build_runtime(config)
    _one_line(str(plugin.value), folder, words)
    assert str(replay.value) in str(plugin.value)
    assert main(["models", "check", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    _one_line(err, folder, words)
    assert str(replay.value) in err


@pytest.mark.parametrize("name", ["grid_nan", "mean_nan", "std_zero", "no_weights"])
def test_lpc_ab_refuses_a_damaged_return_model(
    name: str, damaged_return_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Case 2 verbatim (this replay exited 0 with 12.46 %; the intact model gives 22.54 %),
    and cases 3 and 10 (a NaN mean replayed on the fallback; std 0 and a missing
    model.safetensors were ZeroDivisionError and FileNotFoundError tracebacks)."""
    folder = damaged_return_models[name]
    argv = ["ab", "--trace", "mooncake", "--policies", "lru,lpc-return-model"]
    assert main([*argv, "--return-model", str(folder), "--cache-sizes", "4M"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith(f"lpc ab: error: artifact {folder}")
    _one_line(err, folder, RETURN_DAMAGES[name][3])
    if name == "grid_nan":
        assert err == (
            f"lpc ab: error: artifact {folder}: metadata.json is invalid: grid_s[3] is not "
            "finite (nan)"
        )
    assert captured.out == ""


ACCESS_DAMAGES: dict[str, tuple[Callable | None, str | None, bool, tuple[str, ...]]] = {
    "mean_nan": (
        setter("inputs", "access_features", 0, "mean", value=NAN),
        None,
        False,
        ("metadata.json is invalid", "'log_turn'", "mean is not finite"),
    ),
    "std_zero": (
        setter("inputs", "access_features", 0, "std", value=0.0),
        None,
        False,
        ("metadata.json is invalid", "std must be > 0"),
    ),
    "std_negative": (
        setter("inputs", "access_features", 0, "std", value=-2.0),
        None,
        False,
        ("metadata.json is invalid", "std must be > 0"),
    ),
    "weights_nan": (None, "last", False, ("model.safetensors tensor", "holds NaN")),
    "no_weights": (None, None, True, ("model.safetensors is missing",)),
    "horizon_negative": (
        setter("inputs", "horizon_s", value=-5.0),
        None,
        False,
        ("inputs.horizon_s must be a finite number of seconds > 0",),
    ),
}


@pytest.mark.parametrize("name", sorted(ACCESS_DAMAGES))
def test_every_loader_refuses_a_damaged_access_model_alike(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit, tensor, drop, words = ACCESS_DAMAGES[name]
    folder = damaged_copy(SHIPPED_ACCESS, tmp_path / name, edit, tensor, drop_weights=drop)
    with pytest.raises(ArtifactError) as direct:
        AccessPredictor.load(folder)
    _one_line(str(direct.value), folder, words)
    with pytest.raises(PluginConfigError) as plugin:
        load_access_runtime(PluginConfig(access_model=str(folder)), PluginStats())
    assert str(direct.value) in str(plugin.value) and "\n" not in str(plugin.value)
    assert main(["models", "check", str(folder)]) == 2
    assert str(direct.value) in capsys.readouterr().err


def test_a_text_predictor_with_a_nan_weight_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from predictor.artifact import load_artifact

    folder = damaged_copy(SHIPPED_TEXT, tmp_path / "text", tensor="last")
    with pytest.raises(ArtifactError, match=r"model\.safetensors tensor .* holds NaN") as refused:
        load_artifact(folder)
    _one_line(str(refused.value), folder, ())
    assert main(["models", "check", str(folder)]) == 2
    assert str(refused.value) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("shipped", "kind"),
    [(SHIPPED_RETURN, KIND_RETURN), (SHIPPED_ACCESS, KIND_ACCESS), (SHIPPED_TEXT, KIND_TEXT)],
)
def test_models_check_recognises_each_shipped_kind(
    shipped: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Case 15: the shipped return model was called corrupt ("lacks field
    'feature_config'"); each kind is now checked by its own loader."""
    if kind == KIND_TEXT:
        pytest.importorskip("torch")
    assert artifact_kind(shipped) == kind
    assert main(["models", "check", str(shipped), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["kind"] == kind
    if kind == KIND_RETURN:
        assert printed["predicts"] == "return_time_survival" and printed["grid_s"][0] == 0.0
        assert main(["models", "check", str(shipped)]) == 0
        text = capsys.readouterr().out.splitlines()
        assert text[0] == f"ok: {shipped} (return model)"
        assert "  grid_s: 12 points, 5 s … 840 s" in text


def test_models_check_names_a_missing_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "check", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lpc models: error: ArtifactMissingError") and "nowhere" in err


def test_the_writer_refuses_what_the_loaders_refuse(tmp_path: Path) -> None:
    """Nothing the check refuses can be written: the records refuse themselves, the writer
    refuses non-finite weights before it writes."""
    with pytest.raises(ValueError, match="grid_s\\[1\\] is not finite"):
        ReturnModelMetadata(
            grid_s=(0.0, NAN), inputs=(ReturnInput("log_turn", 0.0, 1.0),), hidden_sizes=()
        )
    with pytest.raises(ValueError, match="std must be > 0"):
        ReturnInput("log_turn", 0.0, 0.0)
    metadata = ReturnModelMetadata(
        grid_s=(0.0, 5.0, 60.0), inputs=(ReturnInput("log_turn", 0.0, 1.0),), hidden_sizes=()
    )
    with pytest.raises(ValueError, match=r"'layers\.0\.bias' holds NaN"):
        save_return_model(tmp_path / "m", metadata, [np.zeros((1, 2))], [np.full(2, NAN)])
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ([0.0, 5.0, NAN], "grid_s[2] is not finite"),
        ([0.0, 5.0, 5.0], "grid_s must increase"),
        ([0.0, 10.0, 5.0], "grid_s must increase"),
        ([0.0, -1.0], "grid_s must increase"),
        ([1.0, 5.0], "grid_s must start at 0"),
        ([0.0], "at least 2 points"),
        ([0.0, True], "grid_s[1] is not a number"),
        ([0.0, float("inf")], "grid_s[1] is not finite"),
    ],
)
def test_grid_check(grid: list[float], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_grid(grid)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("mean", "std", "message"),
    [
        (NAN, 1.0, "mean is not finite"),
        (0.0, NAN, "std is not finite"),
        (0.0, 0.0, "std must be > 0"),
        (0.0, -1.0, "std must be > 0"),
        ("1", 1.0, "mean is not a number"),
        (0.0, True, "std is not a number"),
    ],
)
def test_standardisation_check(mean: Any, std: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_standardisation("log_turn", mean, std)


def test_a_missing_return_folder_or_metadata_is_named(tmp_path: Path) -> None:
    with pytest.raises(ArtifactMissingError, match="nowhere does not exist"):
        ReturnTimePredictor.load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactMissingError, match=r"metadata\.json is missing"):
        ReturnTimePredictor.load(tmp_path / "empty")
