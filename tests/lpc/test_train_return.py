"""`lpc train-return` end to end on a slice of the bundled Mooncake trace.

The slice trains nine candidates (seconds), so this file runs in the slow step (CI step 1b);
the default suite's run of the same command, on a smaller trace:
tests/lpc/test_train_return_refusals.py, `test_the_small_trace_with_an_empty_validation_span_trains`.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from lpc.cli.main import main
from predictor.return_curve import ReturnCurve
from predictor.return_time import ReturnTimePredictor
from tests.lpc.traces.helpers import bundled_lines, write_lines

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("trace")
    trace = write_lines(folder / "slice.jsonl", bundled_lines()[:2500])
    out = tmp_path_factory.mktemp("model") / "return"
    buffer = io.StringIO()
    args = ["train-return", "--trace", str(trace), "--max-epochs", "2", "--out", str(out)]
    with contextlib.redirect_stdout(buffer):
        assert main([*args, "--no-classifier", "--json"]) == 0
    return out, json.loads(buffer.getvalue(), parse_constant=_refuse_constant)


def _refuse_constant(token: str) -> None:
    """A strict parser's view: bare NaN or Infinity is not JSON."""
    raise ValueError(f"the report is not strict JSON: it holds {token}")


def test_report_and_artifact(trained) -> None:
    out, report = trained
    assert set(report["quality"]) == {"model", "km_per_turn"}
    for quality in report["quality"].values():
        assert 0.0 <= quality["concordance"] <= 1.0
        assert 0.0 <= quality["integrated_brier"] <= 1.0
        assert set(quality["auc"]) == {"60", "180", "600"}
    samples = report["samples"]
    assert samples["training"]["samples"] == (
        samples["fit"]["samples"] + samples["validation"]["samples"]
    )
    assert len(report["candidates"]) == 9
    ensemble = report["ensemble"]
    assert report["members"] == (ensemble["members"] if ensemble["adopted"] else 1)
    predictor = ReturnTimePredictor.load(out)
    assert predictor.metadata.grid_s == pytest.approx(report["grid_s"], abs=1e-3)
    assert predictor.metadata.metrics["evaluation"]["model"]["concordance"] == pytest.approx(
        report["quality"]["model"]["concordance"]
    )
    assert isinstance(predictor.curves(predictor.mean[None, :].astype(float))[0], ReturnCurve)


def test_every_quality_figure_has_its_interval(trained) -> None:
    _, report = trained
    intervals = report["quality_ci95"]
    assert intervals["resamples"] == 1000 and intervals["confidence"] == 0.95
    for name, quality in report["quality"].items():
        ci = intervals["sources"][name]
        for figure in ("concordance", "integrated_brier"):
            low, high = ci[figure]
            assert low <= quality[figure] <= high
        for at in ("60", "180", "600"):
            if quality["auc"][at] is None:  # no control followed that long in the slice
                assert ci["auc"][at] is None
                continue
            low, high = ci["auc"][at]
            assert low <= quality["auc"][at] <= high
    difference = intervals["differences"]["model - km_per_turn"]["concordance"]
    point = (
        report["quality"]["model"]["concordance"] - report["quality"]["km_per_turn"]["concordance"]
    )
    assert difference[0] <= point <= difference[1]
    assert set(intervals["differences"]) == {"model - km_per_turn"}  # no classifier scored


def test_negative_resamples_are_refused(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["train-return", "--intervals", "-1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--intervals" in err and "must be >= 0" in err


def test_out_is_not_overwritten(trained) -> None:
    out, _ = trained
    assert main(["train-return", "--out", str(out)]) == 2
