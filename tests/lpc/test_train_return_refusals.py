"""`lpc train-return` refuses data it cannot learn from, in one line, and writes nothing; a
small valid trace whose validation span is empty trains (issue 44, cases 4, 9 and 15)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from lpc.access.return_training import SHIPPED_CLASSIFIER, classifier_path
from lpc.cli.main import main
from predictor.errors import InvalidInputError
from tests.predictor.broken_artifacts import SHIPPED_ACCESS
from tests.training.return_traces import gap_trace, mooncake_slice, one_instant_trace

pytest.importorskip("sklearn")


def _refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("lpc train-return: error: "), err
    return err


def test_a_trace_arriving_at_one_instant_is_refused_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Case 4: it exited 0 and wrote an artifact whose 11 feature means were all NaN. Run
    from outside the checkout with the default classifier (case 15): the refusal is about
    the data, not a classifier path read relative to the working directory."""
    trace = one_instant_trace(tmp_path / "instant.jsonl")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "model"
    err = _refusal(capsys, ["train-return", "--trace", str(trace), "--out", str(out)])
    assert "no usable samples: the training part holds no release" in err
    assert not out.exists()


@pytest.mark.parametrize("requests", [50, 200])
def test_a_trace_without_a_return_is_refused_as_a_single_class(
    requests: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bundled trace's first 50 or 200 requests: no conversation returns in the fitting
    slice. These exited 0 with a model that says "never" and NaN figures."""
    trace = mooncake_slice(tmp_path / "slice.jsonl", requests)
    out = tmp_path / "model"
    argv = ["train-return", "--trace", str(trace), "--no-classifier", "--out", str(out)]
    err = _refusal(capsys, argv)
    assert "a single class: none of the fitting slice's" in err and "censored" in err
    assert not out.exists()


def test_the_default_classifier_is_found_beside_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert classifier_path(SHIPPED_CLASSIFIER) == SHIPPED_ACCESS
    assert classifier_path(None) is None
    assert classifier_path("elsewhere") == Path("elsewhere")
    import lpc.access.return_training as return_training

    monkeypatch.setattr(return_training, "shipped_model_dir", lambda name: None)
    with pytest.raises(InvalidInputError, match="pass --classifier DIR or --no-classifier"):
        classifier_path(SHIPPED_CLASSIFIER)


def _gap_samples(tmp_path: Path):
    from lpc.replay.request_table import request_table
    from lpc.traces.load import TraceOptions, load_trace
    from lpc.traces.timeline import split_in_time
    from predictor.access_features import default_feature_names
    from training.return_data import return_samples

    trace = load_trace(gap_trace(tmp_path / "gap.jsonl"), TraceOptions(None))
    split = split_in_time(trace.requests, 0.5)
    table = request_table(trace.requests, trace.request_types)
    names = default_feature_names(list(table.columns))
    return table, return_samples(table, names, split.cut_s)


def test_an_empty_validation_span_takes_the_training_parts_last_releases(
    tmp_path: Path,
) -> None:
    """Case 9: the validation span of this valid trace holds no release, and the teacher
    was asked for the logits of 0 rows (scikit-learn: "Found array with 0 sample(s)")."""
    from training.return_fit import check_learnable

    table, samples = _gap_samples(tmp_path)
    assert samples.validation_slice == "releases"
    sizes = {p: samples.parts[p].size for p in samples.parts}
    assert sizes["fit"] > 0 and sizes["validation"] > 0
    assert sizes["fit"] + sizes["validation"] == sizes["training"]
    arrivals = table["arrival_s"].to_numpy()
    fit, validation = samples.parts["fit"], samples.parts["validation"]
    cut = samples.cuts.validation_cut_s
    assert arrivals[fit.rows].max() < cut <= arrivals[validation.rows].min()
    # the fitting slice is labelled from its own data only: no return after the cut is seen
    completion = table["completion_s"].to_numpy()[fit.rows]
    seen = completion + fit.targets.time_s
    assert np.all(seen[fit.targets.observed] < cut)
    check_learnable(samples)  # learnable: it trains (the slow test below, end to end)


def test_non_finite_features_are_refused(tmp_path: Path) -> None:
    from dataclasses import replace

    from training.return_data import ReturnPart
    from training.return_fit import check_learnable

    _, samples = _gap_samples(tmp_path)
    fit = samples.parts["fit"]
    features = fit.features.copy()
    features[0, 1] = np.nan
    broken = ReturnPart(features, fit.targets, fit.turn_index, fit.rows)
    samples = replace(samples, parts={**samples.parts, "fit": broken})
    with pytest.raises(InvalidInputError, match="non-finite statistics: the fit slice's") as no:
        check_learnable(samples)
    assert samples.feature_names[1] in str(no.value)


@pytest.mark.slow
def test_the_small_trace_with_an_empty_validation_span_trains(tmp_path: Path) -> None:
    """Case 9 end to end: exit 0, distillation tried, a model every loader accepts."""
    from predictor.artifact_kinds import KIND_RETURN, check_artifact

    trace = gap_trace(tmp_path / "gap.jsonl")
    out = tmp_path / "model"
    argv = ["train-return", "--trace", str(trace), "--no-classifier", "--max-epochs", "3"]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main([*argv, "--intervals", "0", "--out", str(out), "--json"]) == 0
    report = json.loads(buffer.getvalue())
    assert report["validation_slice"] == "releases"
    assert report["distillation"]["tried"] is True
    assert check_artifact(out).kind == KIND_RETURN
    from training.return_distil import HAZARD_TEACHER_PARAMS, HazardTeacher

    _, samples = _gap_samples(tmp_path)
    fit = samples.parts["fit"]
    grid = np.array([0.0, 5.0, 60.0, 600.0])
    teacher = HazardTeacher(
        grid, {**HAZARD_TEACHER_PARAMS, "max_iter": 3, "min_samples_leaf": 1}
    ).fit(fit)
    assert teacher.logits(fit.features[:0]).shape == (0, 3)  # no rows, no logits, no error
