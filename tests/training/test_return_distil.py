"""The hazard teacher: person-period rows, the teacher's logits, the student's regression."""

from __future__ import annotations

import numpy as np
import pytest

from training.return_data import ReturnPart, ReturnTargets
from training.return_distil import HAZARD_TEACHER_PARAMS, HazardTeacher, person_period

torch = pytest.importorskip("torch")

GRID = np.array([0.0, 10.0, 100.0, 1000.0])


def _part(time_s, observed, features=None) -> ReturnPart:
    n = len(time_s)
    x = np.arange(n, dtype=float)[:, None] if features is None else np.asarray(features, float)
    return ReturnPart(
        x,
        ReturnTargets(np.asarray(time_s, float), np.asarray(observed, bool)),
        np.zeros(n, int),
        np.arange(n),
    )


def test_person_period_rows_by_hand() -> None:
    # 0: returns at 50 s (interval 2); 1: censored at sqrt(10 · 100) s, half of interval 2
    # in log time; 2: censored beyond the grid; 3: returns at 5 s (interval 1).
    part = _part([50.0, np.sqrt(1000.0), 5000.0, 5.0], [True, False, False, True])
    rows = person_period(part, GRID)
    log_end = np.log(GRID[1:])
    expected = [
        (0, log_end[0], 0, 1.0),
        (0, log_end[1], 1, 1.0),
        (1, log_end[0], 0, 1.0),
        (1, log_end[1], 0, 0.5),
        (2, log_end[0], 0, 1.0),
        (2, log_end[1], 0, 1.0),
        (2, log_end[2], 0, 1.0),
        (3, log_end[0], 1, 1.0),
    ]
    assert rows.x[:, 0].tolist() == [e[0] for e in expected]
    assert rows.x[:, 1] == pytest.approx([e[1] for e in expected])
    assert rows.label.tolist() == [e[2] for e in expected]
    assert rows.weight == pytest.approx([e[3] for e in expected])


def test_a_censoring_at_an_intervals_start_adds_no_row() -> None:
    rows = person_period(_part([10.0], [False]), GRID)  # silent exactly through interval 1
    assert rows.label.tolist() == [0] and rows.weight == pytest.approx([1.0])


def test_the_teacher_learns_a_hazard_that_depends_on_a_feature() -> None:
    rng = np.random.default_rng(0)
    n = 3000
    fast = rng.random(n) < 0.5
    # fast rows return within 10 s half the time; slow rows never return within the grid
    returns = fast & (rng.random(n) < 0.5)
    time_s = np.where(returns, rng.uniform(1.0, 9.0, n), 2000.0)
    part = _part(time_s, returns, fast[:, None].astype(float))
    teacher = HazardTeacher(GRID).fit(part)
    logits = teacher.logits(np.array([[1.0], [0.0]]))
    assert logits.shape == (2, 3)
    hazard = 1.0 / (1.0 + np.exp(-logits[:, 0]))
    assert hazard[0] == pytest.approx(0.5, abs=0.06)
    assert hazard[1] < 0.02
    assert teacher.iterations >= 1


def test_an_unfitted_or_one_label_teacher_is_refused() -> None:
    with pytest.raises(RuntimeError, match="not fitted"):
        HazardTeacher(GRID).logits(np.zeros((1, 1)))
    with pytest.raises(ValueError, match="returns and non-returns"):
        HazardTeacher(GRID).fit(_part([5000.0, 3000.0], [False, False]))


def test_the_student_regresses_onto_the_teachers_logits() -> None:
    from training.return_fit import ReturnFitConfig, _prepare, train_hazard

    rng = np.random.default_rng(1)
    features = rng.normal(size=(400, 2))
    part = _part(rng.uniform(1, 500, 400), rng.random(400) < 0.5, features)
    prepared = _prepare(part, GRID, features.mean(0), features.std(0))
    # Teacher logits linear in the first feature: a linear student fits them exactly.
    target = np.stack([features[:, 0], -features[:, 0], np.full(400, -2.0)], axis=1)
    teacher = torch.from_numpy(target.astype(np.float32))
    model, _, _ = train_hazard(
        prepared, None, (), 3, ReturnFitConfig(learning_rate=3e-2), 150, teacher
    )
    with torch.no_grad():
        fitted = model(prepared.x).numpy()
    assert fitted == pytest.approx(target, abs=0.05)


def _samples(seed: int = 0):
    """Parts whose return time depends on one feature, non-linearly (a step)."""
    from training.access_data import TimeParts
    from training.return_data import ReturnSamples

    rng = np.random.default_rng(seed)

    def part(n: int) -> ReturnPart:
        x = rng.normal(size=(n, 2))
        soon = x[:, 0] > 0.5
        returns = rng.random(n) < np.where(soon, 0.7, 0.2)
        time_s = np.where(returns, np.where(soon, 8.0, 200.0) * rng.lognormal(0, 0.5, n), 600.0)
        return _part(time_s, returns, x)

    fit, validation = part(600), part(300)
    training = ReturnPart(
        np.concatenate([fit.features, validation.features]),
        ReturnTargets(
            np.concatenate([fit.targets.time_s, validation.targets.time_s]),
            np.concatenate([fit.targets.observed, validation.targets.observed]),
        ),
        np.zeros(900, int),
        np.arange(900),
    )
    parts = {"fit": fit, "validation": validation, "training": training, "evaluation": part(50)}
    return ReturnSamples(
        ("log_turn", "log_prompt_tokens"), parts, TimeParts(600, 900, 1200.0, 1800.0), 0.0
    )


@pytest.fixture
def quick_teacher(monkeypatch) -> None:
    """The teacher at 40 boosting rounds instead of 400 (a second less per teacher fit): the
    tests using it check what the fit does with a teacher's logits, not how good they are (the
    teacher's learning is checked above, at its own settings)."""
    monkeypatch.setitem(HAZARD_TEACHER_PARAMS, "max_iter", 40)


@pytest.mark.parametrize("distil", [True, False])
def test_the_recipe_served_follows_the_validation_rule(distil: bool, quick_teacher) -> None:
    from training.return_fit import (
        HIDDEN_CANDIDATES,
        SIMPLER_MARGIN_NATS,
        ReturnFitConfig,
        fit_return_model,
    )

    # A few epochs: the rule is checked on whatever the fits reach, adopted or not.
    result = fit_return_model(_samples(), ReturnFitConfig(max_epochs=6, patience=2, distil=distil))
    d = result.distillation
    if not distil:
        assert d == {"tried": False, "adopted": False} and result.recipe == "likelihood"
        return
    assert [s["hidden"] for s in d["students"]] == [list(h) for h in HIDDEN_CANDIDATES]
    assert d["adopted"] == (d["likelihood_val_nll"] - d["chosen"]["val_nll"] > SIMPLER_MARGIN_NATS)
    assert result.recipe == ("distilled" if d["adopted"] else "likelihood")
    if d["adopted"]:
        assert result.members == 1 and list(result.hidden) == d["chosen"]["hidden"]


def test_an_adopted_student_is_served_alone(monkeypatch, quick_teacher) -> None:
    """The serving path of a distilled student: with the margin lowered so that any student
    is adopted, one network of the chosen student's kind is served, and the predictor's
    curves are its curves."""
    import training.return_fit as return_fit
    from predictor.return_time import ReturnTimePredictor

    monkeypatch.setattr(return_fit, "SIMPLER_MARGIN_NATS", -10.0)
    samples = _samples()
    result = return_fit.fit_return_model(
        samples, return_fit.ReturnFitConfig(max_epochs=5, patience=2)
    )
    d = result.distillation
    assert d["adopted"] and result.recipe == "distilled" and result.members == 1
    assert list(result.hidden) == d["chosen"]["hidden"]
    assert result.epochs == d["chosen"]["epochs"] and d["served_teacher_iterations"] >= 1
    predictor = ReturnTimePredictor(
        result.metadata(samples.feature_names), result.weights, result.biases
    )
    curves = predictor.curves(samples.parts["evaluation"].features)
    assert len(curves) == 50 and all(0.0 <= c.never_share <= 1.0 for c in curves)


def test_a_fitting_slice_without_returns_is_refused_before_any_fit() -> None:
    """A single class (every release censored): neither the hazard nor its teacher can be
    learnt, so nothing is fitted (the teacher's own refusal is kept for a part whose
    person-period rows are of one label all the same)."""
    from dataclasses import replace

    from predictor.errors import InvalidInputError
    from training.return_fit import ReturnFitConfig, fit_return_model

    samples = _samples()
    fit = samples.parts["fit"]
    silent = _part(np.full(fit.size, 600.0), np.zeros(fit.size, bool), fit.features)
    samples = replace(samples, parts={**samples.parts, "fit": silent})
    with pytest.raises(InvalidInputError, match="a single class: none of the fitting") as refused:
        fit_return_model(samples, ReturnFitConfig(max_epochs=3, patience=2))
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="returns and non-returns"):
        HazardTeacher(GRID).fit(silent)
