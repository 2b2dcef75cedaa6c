"""The hazard teacher: person-period rows, the teacher's logits, the student's regression."""

from __future__ import annotations

import numpy as np
import pytest

from training.return_data import ReturnPart, ReturnTargets
from training.return_distil import HazardTeacher, person_period

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
