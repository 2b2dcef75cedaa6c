"""The return-time artifact: round trip, declared target, valid curves, engine-state path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from predictor.access_features import ConversationState, RequestState, feature_row
from predictor.artifact import ArtifactCorruptError, ArtifactIncompatibleError
from predictor.return_curve import ReturnCurve, continued_hazard_exponent, log_spaced_edges
from predictor.return_time import (
    METADATA_FILE,
    PREDICTS,
    WEIGHTS_FILE,
    ReturnInput,
    ReturnModelMetadata,
    ReturnTimePredictor,
    save_return_model,
    survival_from_logits,
)

NAMES = ("log_turn", "log_prompt_tokens", "log_think_time_s")


def _model(tmp_path: Path) -> tuple[Path, list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(0)
    grid = log_spaced_edges(5.0, 600.0, 6)
    weights = [rng.normal(size=(3, 4)), rng.normal(size=(4, len(grid) - 1))]
    biases = [rng.normal(size=4), rng.normal(size=len(grid) - 1)]
    metadata = ReturnModelMetadata(
        grid_s=tuple(grid),
        inputs=(
            ReturnInput(NAMES[0], 0.5, 1.0),
            ReturnInput(NAMES[1], 8.0, 2.0),
            ReturnInput(NAMES[2], 1.0, 3.0),
        ),
        hidden_sizes=(4,),
    )
    folder = tmp_path / "return"
    save_return_model(folder, metadata, weights, biases)
    return folder, weights, biases


def test_survival_from_logits() -> None:
    survival = survival_from_logits(np.array([[0.0, 0.0], [-50.0, 50.0]]))
    assert survival[0] == pytest.approx([1.0, 0.5, 0.25])
    assert survival[1] == pytest.approx([1.0, 1.0, 0.0], abs=1e-12)


def test_round_trip_and_declared_target(tmp_path: Path) -> None:
    folder, weights, biases = _model(tmp_path)
    record = json.loads((folder / METADATA_FILE).read_text())
    assert record["predicts"] == PREDICTS == "return_time_survival"
    assert record["time_origin"] == "completion" and len(record["grid_s"]) == 7
    predictor = ReturnTimePredictor.load(folder)
    x = np.array([[0.0, 7.0, 0.0], [1.5, 10.0, 4.0]])
    hidden = np.maximum(((x - [0.5, 8.0, 1.0]) / [1.0, 2.0, 3.0]) @ weights[0] + biases[0], 0)
    expected = survival_from_logits(hidden @ weights[1] + biases[1])
    assert predictor.survival(x) == pytest.approx(expected, rel=1e-5)
    for curve in predictor.curves(x):
        assert isinstance(curve, ReturnCurve)  # validates: starts at 1, never increases
        assert 0.0 <= curve.p_return_within(30.0, 180.0) <= 1.0


def test_engine_state_path_equals_the_batch(tmp_path: Path) -> None:
    predictor = ReturnTimePredictor.load(_model(tmp_path)[0])
    conversation = ConversationState().after(RequestState(0.0, 1000, 0, 100, 5.0))
    request = RequestState(60.0, 2000, 1100, 100, 70.0)
    curve = predictor.curve_one(request, conversation)
    row = np.array([feature_row(NAMES, request, conversation)])
    assert curve.survival == pytest.approx(predictor.survival(row)[0], rel=1e-6)
    assert predictor.known_at == "arrival"


def test_tampered_or_foreign_artifacts_are_refused(tmp_path: Path) -> None:
    folder, _, _ = _model(tmp_path)
    payload = bytearray((folder / WEIGHTS_FILE).read_bytes())
    payload[-1] ^= 1
    (folder / WEIGHTS_FILE).write_bytes(bytes(payload))
    with pytest.raises(ArtifactCorruptError, match="sha256"):
        ReturnTimePredictor.load(folder)
    folder, _, _ = _model(tmp_path / "other")
    record = json.loads((folder / METADATA_FILE).read_text())
    record["predicts"] = "continuation_probability"
    (folder / METADATA_FILE).write_text(json.dumps(record))
    with pytest.raises(ArtifactIncompatibleError, match="return_time_survival"):
        ReturnTimePredictor.load(folder)


def test_table_path_equals_the_engine_state_path(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    predictor = ReturnTimePredictor.load(_model(tmp_path)[0])
    table = pd.DataFrame(
        {
            "conversation_id": ["a", "a"],
            "arrival_s": [0.0, 60.0],
            "completion_s": [5.0, 70.0],
            "prompt_tokens": [1000, 2000],
            "output_tokens": [100, 100],
            "shared_prefix_tokens": [0, 1100],
        }
    )
    conversation = ConversationState().after(RequestState(0.0, 1000, 0, 100, 5.0))
    second = predictor.curve_one(RequestState(60.0, 2000, 1100, 100, 70.0), conversation)
    assert predictor.survival_table(table)[1] == pytest.approx(second.survival, rel=1e-5)


def test_the_tail_is_the_same_on_every_path_and_unknown_ones_are_refused(
    tmp_path: Path,
) -> None:
    folder = _model(tmp_path)[0]
    flat = ReturnTimePredictor.load(folder)
    tailed = ReturnTimePredictor.load(folder, tail="log-linear")
    conversation = ConversationState().after(RequestState(0.0, 1000, 0, 100, 5.0))
    request = RequestState(60.0, 2000, 1100, 100, 70.0)
    one = tailed.curve_one(request, conversation)
    row = np.array([feature_row(NAMES, request, conversation)])
    batch = tailed.curves(row)[0]
    assert one.tail_exponent == pytest.approx(batch.tail_exponent, rel=1e-5)
    assert one.tail_exponent == pytest.approx(continued_hazard_exponent(one.times_s, one.survival))
    assert flat.curve_one(request, conversation).tail_exponent == 0.0
    assert flat.curves(row)[0].survival_at(6000.0) == pytest.approx(batch.survival[-1], rel=1e-5)
    assert one.tail_exponent > 0  # this model's last interval does lose survivors
    assert batch.survival_at(6000.0) < batch.survival[-1]
    with pytest.raises(ValueError, match="unknown return-curve tail 'steep'"):
        ReturnTimePredictor.load(folder, tail="steep")
