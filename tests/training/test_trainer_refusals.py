"""The return-time trainer's siblings refuse unlearnable data in one line too: the access
classifier (`lpc train --trace`) and the text predictor (`lpc train`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lpc.cli.main import main
from predictor.errors import InvalidInputError
from tests.training.return_traces import gap_trace, one_instant_trace
from training.access_data import AccessSamples, TimeParts
from training.access_fit import check_learnable

NAMES = ("log_turn", "log_prompt_tokens")


def _refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("lpc train: error: "), err
    return err


def test_the_access_trainer_refuses_a_trace_arriving_at_one_instant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = one_instant_trace(tmp_path / "instant.jsonl")
    out = tmp_path / "model"
    err = _refusal(capsys, ["train", "--trace", str(trace), "--horizon", "60", "--out", str(out)])
    assert "no usable samples: the training part holds no request" in err
    assert not out.exists()


def test_the_access_trainer_names_an_empty_validation_slice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = gap_trace(tmp_path / "gap.jsonl")
    out = tmp_path / "model"
    err = _refusal(capsys, ["train", "--trace", str(trace), "--horizon", "60", "--out", str(out)])
    assert "no usable samples: the validation slice of the training part holds no request" in err
    assert not out.exists()


def _samples(fit_labels, fit_features=None, censored: int = 0) -> AccessSamples:
    fit_labels = np.asarray(fit_labels, float)
    n = fit_labels.size
    features = np.zeros((n, 2)) if fit_features is None else np.asarray(fit_features, float)
    good = np.array([0.0, 1.0])
    return AccessSamples(
        NAMES,
        {"fit": features, "validation": np.zeros((2, 2)), "evaluation": np.zeros((2, 2))},
        {"fit": fit_labels, "validation": good, "evaluation": good},
        {p: np.zeros(2, int) for p in ("fit", "validation", "evaluation")},
        {"fit": censored, "validation": 0, "evaluation": 0},
        TimeParts(n, n + 2, 10.0, 20.0),
        60.0,
    )


def test_the_access_trainer_says_what_is_missing() -> None:
    with pytest.raises(InvalidInputError, match="no usable samples: the fit slice holds no"):
        check_learnable(_samples([], censored=5))
    with pytest.raises(
        InvalidInputError, match=r"a single class: the fit slice.s 3 .* all labelled 0"
    ):
        check_learnable(_samples([0, 0, 0]))
    features = [[0.0, 1.0], [np.nan, 1.0], [0.0, np.inf]]
    with pytest.raises(InvalidInputError, match="non-finite statistics") as refused:
        check_learnable(_samples([0, 1, 1], features))
    assert "log_turn, log_prompt_tokens" in str(refused.value)
    check_learnable(_samples([0, 1, 1]))  # learnable


def test_the_text_trainer_refuses_no_samples() -> None:
    from training.pipeline import check_both_labels

    with pytest.raises(InvalidInputError, match="no usable samples: the training half"):
        check_both_labels([])
