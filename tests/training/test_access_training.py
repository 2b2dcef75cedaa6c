"""Access-model training: censored horizon labels, the time split, the artifact and its
numpy predictor."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictor.access_features import feature_frame
from predictor.access_predictor import AccessPredictor
from predictor.artifact import (
    ArtifactChecksumError,
    ArtifactCorruptError,
    ArtifactIncompatibleError,
    read_metadata,
)
from training.access_data import access_samples, horizon_labels
from training.access_fit import (
    AccessFitConfig,
    fit_access_model,
    merge_members,
    save_access_model,
    training_targets,
)

COLUMNS = [
    "conversation_id",
    "arrival_s",
    "completion_s",
    "prompt_tokens",
    "output_tokens",
    "shared_prefix_tokens",
]


def small_table() -> pd.DataFrame:
    rows = [
        ("a", 0.0, 10.0, 100, 20, 0),
        ("b", 5.0, 8.0, 50, 5, 0),
        ("a", 40.0, 50.0, 150, 30, 120),
        ("a", 200.0, 210.0, 300, 10, 180),
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def test_horizon_labels_censor_instead_of_calling_an_end() -> None:
    labels = horizon_labels(small_table(), horizon_s=60.0, end_s=200.0).tolist()
    assert labels[0] == 1.0  # next arrives 30 s after completion
    assert labels[1] == 0.0  # no next, and 8 + 60 <= 200: the data shows the end
    assert labels[2] == 0.0  # next arrives 150 s after completion: beyond the horizon
    assert math.isnan(labels[3])  # 210 + 60 > 200 with no next: censored


def test_labels_ignore_arrivals_after_the_end_they_are_given() -> None:
    labels = horizon_labels(small_table(), horizon_s=60.0, end_s=100.0).tolist()
    # a's next at 200 s is past the end: unknown, and 50 + 60 > 100, so censored.
    assert labels[:2] == [1.0, 0.0]
    assert math.isnan(labels[2]) and math.isnan(labels[3])


def synthetic_trace(n_conversations: int = 400, seed: int = 0) -> pd.DataFrame:
    """Conversations whose users return quickly when their think times are short (the
    signal), over 2 hours."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(n_conversations):
        t = rng.uniform(0, 7200)
        fast = rng.random() < 0.5
        prompt = int(rng.integers(100, 2000))
        for _ in range(int(rng.integers(1, 6))):
            output = int(rng.integers(10, 500))
            rows.append((f"c{c}", t, t + 5.0, prompt, output, 0))
            t += 5.0 + (rng.exponential(20) if fast else rng.exponential(900))
            prompt += output + int(rng.integers(10, 300))
    table = pd.DataFrame(rows, columns=COLUMNS).sort_values("arrival_s", kind="stable")
    table = table.reset_index(drop=True)
    shared = []
    last: dict[str, int] = {}
    for conv, prompt in zip(table["conversation_id"], table["prompt_tokens"], strict=True):
        shared.append(min(last.get(conv, 0), prompt))
        last[conv] = prompt
    table["shared_prefix_tokens"] = shared
    return table


NAMES = ("log_turn", "log_think_time_s", "log_mean_think_time_s", "log_prompt_tokens")


def test_parts_are_split_by_time_and_labelled_from_their_own_data() -> None:
    table = synthetic_trace()
    cut = 3600.0
    samples = access_samples(table, NAMES, cut, horizon_s=300.0, validation_fraction=0.25)
    parts = samples.parts
    arrivals = table["arrival_s"].to_numpy()
    assert arrivals[: parts.validation].max() < parts.validation_cut_s <= cut
    assert arrivals[parts.validation : parts.evaluation].max() < cut
    assert arrivals[parts.evaluation :].min() >= cut
    assert parts.validation_cut_s == pytest.approx(arrivals[0] + 0.75 * (cut - arrivals[0]))
    # The fitting slice's labels end at its own cut: none looks into the validation slice.
    fit_table = table.iloc[: parts.validation]
    expected = horizon_labels(fit_table, 300.0, parts.validation_cut_s).to_numpy()
    np.testing.assert_array_equal(samples.labels["fit"], expected[~np.isnan(expected)])
    assert samples.censored["fit"] == int(np.isnan(expected).sum()) > 0
    for part in ("fit", "validation", "evaluation"):
        assert samples.features[part].shape == (samples.labels[part].size, len(NAMES))


@pytest.fixture(scope="module")
def fitted():
    samples = access_samples(synthetic_trace(), NAMES, 3600.0, horizon_s=300.0)
    return samples, fit_access_model(samples, AccessFitConfig(hidden_sizes=(8, 8), max_epochs=10))


def test_the_model_learns_the_think_time_signal(fitted) -> None:
    _, result = fitted
    assert result.metrics["mlp"]["roc_auc"] > 0.65
    assert result.metrics["mlp"]["roc_auc"] > result.metrics["turns_only"]["roc_auc"]
    assert {"mcc", "macro_f1", "brier"} <= set(result.metrics["gbm"])


def test_an_ensemble_is_one_mlp_whose_logit_is_the_members_mean() -> None:
    import torch

    from predictor.model import ContinuationMLP, MLPConfig

    members = []
    for seed in range(3):
        torch.manual_seed(seed)
        members.append(ContinuationMLP(MLPConfig(0, (5, 4), 0.0, NAMES, turn_column=False)))
    merged = merge_members(members)
    assert merged.config.hidden_sizes == (15, 12)
    x = torch.randn(32, len(NAMES))
    with torch.no_grad():
        expected = torch.stack([m(x) for m in members]).mean(dim=0)
        np.testing.assert_allclose(merged(x).numpy(), expected.numpy(), atol=1e-6)


def test_members_are_early_stopped_then_refitted_on_the_whole_training_part(fitted) -> None:
    samples, result = fitted
    metrics = result.metrics
    assert metrics["ensemble"] == 4 and len(metrics["member_epochs"]) == 4
    assert result.model.config.hidden_sizes == (32, 32)  # four 8x8 members side by side
    assert 0.5 < metrics["validation"]["mlp"]["roc_auc"] <= 1.0
    assert 0.5 < metrics["validation"]["gbm"]["roc_auc"] <= 1.0
    # Refitted: the standardisation is the whole training part's, not the fitting slice's.
    whole = np.concatenate([samples.features["fit"], samples.features["validation"]])
    np.testing.assert_allclose(
        [f.mean for f in result.inputs.access_features], whole.mean(axis=0), rtol=1e-9
    )
    single = fit_access_model(
        samples, AccessFitConfig(hidden_sizes=(8, 8), max_epochs=10, ensemble=1, refit=False)
    )
    np.testing.assert_allclose(
        [f.mean for f in single.inputs.access_features],
        samples.features["fit"].mean(axis=0),
        rtol=1e-9,
    )
    assert single.model.config.hidden_sizes == (8, 8)


def test_targets_mix_the_label_with_the_trees_fitted_on_the_same_rows() -> None:
    from sklearn.ensemble import HistGradientBoostingClassifier

    from training.access_fit import TEACHER_GBM_PARAMS

    samples = access_samples(synthetic_trace(), NAMES, 3600.0, horizon_s=300.0)
    x, y = samples.features["fit"], samples.labels["fit"]
    labels_only = training_targets(x, y, AccessFitConfig(teacher_share=0.0))
    np.testing.assert_array_equal(labels_only, y.astype(np.float64))
    teacher = HistGradientBoostingClassifier(random_state=0, **TEACHER_GBM_PARAMS).fit(x, y)
    expected = teacher.predict_proba(x)[:, 1]
    mimic = training_targets(x, y, AccessFitConfig(teacher_share=1.0))
    np.testing.assert_allclose(mimic, expected)
    assert mimic.min() > 0.0 and mimic.max() < 1.0  # soft: never a 0/1 label
    half = training_targets(x, y, AccessFitConfig(teacher_share=0.5))
    np.testing.assert_allclose(half, 0.5 * y + 0.5 * expected)


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_teacher_share_outside_zero_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="teacher share must be in"):
        AccessFitConfig(teacher_share=share)


def test_labels_only_training_still_learns_and_says_so(fitted) -> None:
    samples, distilled = fitted
    assert distilled.metrics["teacher_share"] == 1.0  # the default
    plain = fit_access_model(
        samples, AccessFitConfig(hidden_sizes=(8, 8), max_epochs=10, teacher_share=0.0)
    )
    assert plain.metrics["teacher_share"] == 0.0
    assert plain.metrics["mlp"]["roc_auc"] > 0.65
    # Different targets, different model.
    assert not np.allclose(plain.metrics["mlp"]["brier"], distilled.metrics["mlp"]["brier"])


def test_artifact_round_trip_and_numpy_matches_torch(fitted, tmp_path: Path) -> None:
    import torch

    samples, result = fitted
    folder = tmp_path / "access"
    save_access_model(folder, result, "fp", {"trace": "synthetic"})
    metadata = read_metadata(folder)
    assert not metadata.inputs.text_window and metadata.inputs.access_names == NAMES
    assert metadata.inputs.horizon_s == 300.0
    predictor = AccessPredictor.load(folder)
    raw = samples.features["evaluation"]
    mean = np.array([f.mean for f in result.inputs.access_features])
    std = np.array([f.std for f in result.inputs.access_features])
    with torch.no_grad():
        logits = result.model(torch.from_numpy(((raw - mean) / std).astype(np.float32)))
    expected = torch.sigmoid(logits).numpy()
    np.testing.assert_allclose(predictor.predict(raw), expected, atol=2e-6)
    # One request at a time (engine state) gives the batched value.
    table = synthetic_trace()
    batched = predictor.predict_table(table)
    np.testing.assert_allclose(
        predictor.predict(feature_frame(table, NAMES).to_numpy()[:5]), batched[:5]
    )


def test_a_corrupt_or_mismatched_artifact_is_refused(fitted, tmp_path: Path) -> None:
    _, result = fitted
    folder = tmp_path / "access"
    save_access_model(folder, result, "fp", {})
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactChecksumError, match="sha256"):
        AccessPredictor.load(folder)

    save_access_model(folder, result, "fp", {})
    meta_path = folder / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["inputs"]["access_features"][0]["name"] = "log_shoe_size"
    meta["mlp_config"]["extra_features"][0] = "log_shoe_size"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ArtifactIncompatibleError, match="unknown feature 'log_shoe_size'"):
        AccessPredictor.load(folder)

    meta["inputs"]["access_features"][0]["std"] = 0
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ArtifactCorruptError, match="std must be > 0"):
        AccessPredictor.load(folder)


def test_text_artifacts_load_unchanged_and_are_not_access_models() -> None:
    shipped = Path(__file__).resolve().parents[2] / "models" / "sharegpt-e5-small-q4"
    metadata = read_metadata(shipped)
    assert metadata.inputs.text_window and not metadata.inputs.access_features
    assert "inputs" not in json.loads((shipped / "metadata.json").read_text())
    assert "inputs" not in metadata.to_dict()  # re-saved text artifacts keep their shape
    with pytest.raises(ArtifactIncompatibleError, match="not an access-only model"):
        AccessPredictor.load(shipped)


def test_the_text_predictor_refuses_an_access_artifact(fitted, tmp_path: Path) -> None:
    from predictor.predictor import Predictor

    _, result = fitted
    folder = tmp_path / "access"
    save_access_model(folder, result, "fp", {})
    with pytest.raises(ArtifactIncompatibleError, match="AccessPredictor"):
        Predictor.load(folder)


def test_one_class_after_censoring_is_a_clear_error() -> None:
    samples = access_samples(synthetic_trace(), NAMES, 3600.0, horizon_s=3500.0)
    with pytest.raises(ValueError, match="shorter --horizon"):
        fit_access_model(samples, AccessFitConfig(max_epochs=1))
