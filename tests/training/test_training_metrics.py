"""Held-out metrics against scikit-learn's definitions and hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from training.metrics import brier_prior_corrected, classification_metrics, prior_shift


def test_perfect_and_inverted_predictors():
    labels = np.array([0, 0, 1, 1, 1])
    perfect = classification_metrics(labels, np.array([0.1, 0.2, 0.8, 0.9, 0.7]))
    assert perfect.mcc == pytest.approx(1.0)
    assert perfect.macro_f1 == pytest.approx(1.0)
    assert perfect.roc_auc == pytest.approx(1.0)
    inverted = classification_metrics(labels, np.array([0.9, 0.8, 0.2, 0.1, 0.3]))
    assert inverted.mcc == pytest.approx(-1.0)
    assert inverted.roc_auc == pytest.approx(0.0)


def test_hand_computed_confusion():
    labels = np.array([1, 1, 1, 0, 0, 0])
    probabilities = np.array([0.9, 0.6, 0.4, 0.7, 0.2, 0.1])
    m = classification_metrics(labels, probabilities)
    tp, fn, fp, tn = 2, 1, 1, 2
    mcc = (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert m.mcc == pytest.approx(mcc)
    assert m.macro_f1 == pytest.approx(2 / 3)
    assert m.brier == pytest.approx(np.mean((probabilities - labels) ** 2))
    assert m.roc_auc == pytest.approx(7 / 9)  # 7 of 9 (positive, negative) pairs ordered
    assert m.predicted_positive_rate == pytest.approx(0.5)


def test_constant_predictor_has_zero_mcc():
    labels = np.array([1, 1, 0, 1])
    assert classification_metrics(labels, np.full(4, 0.9)).mcc == 0.0


def test_prior_shift_keeps_order_and_fixes_calibration():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.01, 0.99, 200)
    shifted = prior_shift(p, 0.5, 0.7)
    assert np.array_equal(np.argsort(p), np.argsort(shifted))
    assert prior_shift(np.array([0.5]), 0.5, 0.7)[0] == pytest.approx(0.7)
    labels = (rng.uniform(size=200) < 0.7).astype(int)
    assert (
        brier_prior_corrected(labels, np.full(200, 0.5), 0.5, 0.7)
        < classification_metrics(labels, np.full(200, 0.5)).brier
    )


def test_rejects_mismatched_or_invalid_input():
    with pytest.raises(ValueError, match="labels but"):
        classification_metrics(np.array([1, 0]), np.array([0.5]))
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        classification_metrics(np.array([1, 0]), np.array([0.5, 1.5]))
