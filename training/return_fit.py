"""Fit the return-time model (a discrete-time hazard) and its Kaplan–Meier-per-turn baseline.

Every choice — the grid, the architecture, the epochs, an ensemble, a distilled student — is
made on the training part by a validation log-likelihood rule fixed before the evaluation part
is read (docs/results.md, "When a conversation returns"). Data the hazard cannot be learnt
from is refused before any fit (`check_learnable`), and a fit whose served weights come out
non-finite is refused too. The likelihood is censoring-aware and matches the curve the
predictor serves.

The rules and the likelihood: docs/design.md, "The return-time fit".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from predictor.artifact_checks import non_finite_tensor
from predictor.errors import InvalidInputError
from predictor.return_curve import ReturnCurve, log_spaced_edges
from predictor.return_time import ReturnInput, ReturnModelMetadata
from training.return_data import ReturnPart, ReturnSamples, ReturnTargets
from training.return_distil import HAZARD_TEACHER_PARAMS, HazardTeacher
from training.return_grid import IntervalIndex, interval_index
from training.survival_metrics import kaplan_meier

GRID_FIRST_S = 5.0
GRID_COUNTS = (8, 12, 16)  # grid points after 0
HIDDEN_CANDIDATES: tuple[tuple[int, ...], ...] = ((), (32,), (32, 32))
SIMPLER_MARGIN_NATS = 0.002
ENSEMBLE_MEMBERS = 4
KM_MIN_ROWS_PER_TURN = 100  # turns with fewer training rows share the pooled tail's curve
KM_GRID_COUNT = 64


@dataclass(frozen=True)
class ReturnFitConfig:
    learning_rate: float = 3e-3
    batch_size: int = 256
    max_epochs: int = 200
    patience: int = 15
    seed: int = 0
    threads: int = 1
    distil: bool = True  # also try students of a gradient-boosted teacher (the module)


def training_grid_last_s(samples: ReturnSamples) -> float:
    """Half the training part's span, rounded down to whole minutes (at least 60 s)."""
    span = samples.cuts.evaluation_cut_s - samples.span_start_s
    return max(60.0, 60.0 * np.floor(span / 2.0 / 60.0))


def check_learnable(samples: ReturnSamples) -> None:
    """`InvalidInputError` (one line: what is missing, and where) unless the fitting and the
    validation slice each hold releases with finite features and the fitting slice saw at
    least one return inside the grid: a hazard fitted without one would say "never returns"
    for everyone, and standardising an empty or non-finite column gives NaN statistics."""
    sizes = {p: samples.parts[p].size for p in ("fit", "validation")}
    if sizes["fit"] + sizes["validation"] == 0:
        raise InvalidInputError(
            "no usable samples: the training part holds no release (a trace whose requests "
            "all arrive at one instant has no span to split; a later --split-at, or a longer "
            "trace)"
        )
    for part, size in sizes.items():
        if size == 0:
            raise InvalidInputError(
                f"no usable samples: the {part} slice of the training part holds no release "
                f"({sizes['fit']} fit, {sizes['validation']} validation; its requests arrive "
                "at too few instants to split)"
            )
    for part in ("fit", "validation"):
        features = samples.parts[part].features
        finite = np.isfinite(features).all(axis=0)
        if not finite.all():
            names = [n for n, ok in zip(samples.feature_names, finite, strict=True) if not ok]
            raise InvalidInputError(
                f"non-finite statistics: the {part} slice's feature(s) {', '.join(names)} "
                "hold NaN or infinite values"
            )
    fit = samples.parts["fit"].targets
    last_s = training_grid_last_s(samples)
    inside = int((fit.observed & (fit.time_s <= last_s)).sum())
    if inside == 0:
        raise InvalidInputError(
            f"a single class: none of the fitting slice's {sizes['fit']} releases saw its "
            f"conversation return within the grid's {last_s:g} s (every one censored); a "
            "longer trace or a later --split-at"
        )


def density_constant(grid_s: np.ndarray, targets: ReturnTargets) -> np.ndarray:
    """Per row, the part of the log-density that depends on t and the grid only (0 for a
    censored row and a return beyond the grid)."""
    grid_s = np.asarray(grid_s, float)
    index = interval_index(grid_s, targets.time_s)
    k = index.interval
    t = np.maximum(targets.time_s, 1e-9)
    width = np.where(
        k == 1,
        np.log(grid_s[1]),
        np.log(t) + np.log(np.log(grid_s[k] / np.maximum(grid_s[k - 1], 1e-300))),
    )
    return np.where(targets.observed & ~index.beyond, -width, 0.0)


def log_likelihood(logits, index: IntervalIndex, observed):
    """(n,) torch log-likelihood of hazard `logits` (n, K): an observed return inside the
    grid → log P(its interval); censored (or beyond the grid) → log S at its time."""
    import torch

    log_keep = -torch.nn.functional.softplus(logits)  # log(1 − h)
    cumulative = torch.cumsum(log_keep, dim=1)
    before = torch.cat([torch.zeros_like(cumulative[:, :1]), cumulative], dim=1)  # log S(t_{k-1})
    k = torch.as_tensor(index.interval, dtype=torch.long)
    rows = torch.arange(logits.shape[0])
    log_s_before = before[rows, k - 1]
    logit_k = logits[rows, k - 1]
    hazard = torch.sigmoid(logit_k)
    w = torch.as_tensor(index.weight, dtype=logits.dtype)
    log_event = log_s_before + torch.nn.functional.logsigmoid(logit_k)
    log_censored = log_s_before + torch.log1p(-(w * hazard).clamp(max=1 - 1e-7))
    event = torch.as_tensor(np.asarray(observed, bool) & ~index.beyond)
    return torch.where(event, log_event, log_censored)


def _network(inputs: int, hidden: tuple[int, ...], outputs: int):
    import torch

    layers: list[Any] = []
    width = inputs
    for size in hidden:
        layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
        width = size
    layers.append(torch.nn.Linear(width, outputs))
    return torch.nn.Sequential(*layers)


def _standardisation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = x.mean(axis=0), x.std(axis=0)
    return mean, np.where(std > 1e-9, std, 1.0)


@dataclass
class _Prepared:
    x: Any  # torch tensor, standardised
    index: IntervalIndex
    observed: np.ndarray
    constant: np.ndarray


def _prepare(part: ReturnPart, grid_s: np.ndarray, mean: np.ndarray, std: np.ndarray):
    import torch

    x = torch.from_numpy(((part.features - mean) / std).astype(np.float32))
    index = interval_index(grid_s, part.targets.time_s)
    return _Prepared(x, index, part.targets.observed, density_constant(grid_s, part.targets))


def _subset(prepared: _Prepared, rows) -> tuple[Any, IntervalIndex, np.ndarray]:
    r = rows.numpy()
    index = prepared.index
    return (
        prepared.x[rows],
        IntervalIndex(index.interval[r], index.weight[r], index.beyond[r]),
        prepared.observed[r],
    )


def _row_log_density(model, prepared: _Prepared) -> np.ndarray:
    """Per row, the log-density (the grid's constant included)."""
    import torch

    with torch.no_grad():
        ll = log_likelihood(model(prepared.x), prepared.index, prepared.observed).numpy()
    return ll.astype(np.float64) + prepared.constant


def _mean_nll(model, prepared: _Prepared) -> float:
    return float(-_row_log_density(model, prepared).mean())


def mixture_nll(row_log_densities: list[np.ndarray]) -> float:
    """Mean negative log-density of the average of the members' curves: each row's
    likelihood (a probability, a density or a survival, all linear in S) is the members'
    average."""
    stacked = np.stack(row_log_densities)
    top = stacked.max(axis=0)
    mixed = top + np.log(np.exp(stacked - top).mean(axis=0))
    return float(-mixed.mean())


def train_hazard(
    train: _Prepared,
    validation: _Prepared | None,
    hidden: tuple[int, ...],
    outputs: int,
    config: ReturnFitConfig,
    epochs: int,
    teacher_logits: Any = None,
):
    """One hazard network; with `validation`, the epoch of lowest validation NLL. Trained on
    the likelihood, or, given `teacher_logits` (a tensor of `train`'s rows × intervals), to
    regress its logits onto the teacher's (mean squared error; `training.return_distil`);
    early stopping reads the validation likelihood either way."""
    import torch

    from training.loop import permuted_batches, train_loop

    torch.manual_seed(config.seed)
    model = _network(train.x.shape[1], hidden, outputs)

    def batch_loss(model: Any, rows: Any) -> Any:
        x, index, observed = _subset(train, rows)
        logits = model(x)
        if teacher_logits is None:
            return -log_likelihood(logits, index, observed).mean()
        return ((logits - teacher_logits[rows]) ** 2).mean()

    result = train_loop(
        model,
        batch_loss,
        permuted_batches(
            train.x.shape[0], config.batch_size, torch.Generator().manual_seed(config.seed)
        ),
        learning_rate=config.learning_rate,
        max_epochs=epochs,
        patience=config.patience,
        validation=None if validation is None else lambda model: _mean_nll(model, validation),
    )
    return model, result.best_epoch, result.best_loss


@dataclass
class ReturnFitResult:
    grid_s: np.ndarray
    hidden: tuple[int, ...]
    epochs: int
    weights: list[np.ndarray]  # (in, out), as the numpy predictor multiplies
    biases: list[np.ndarray]
    mean: np.ndarray
    std: np.ndarray
    candidates: list[dict[str, Any]] = field(default_factory=list)
    fit_seconds: float = 0.0
    members: int = 1
    ensemble: dict[str, Any] = field(default_factory=dict)
    distillation: dict[str, Any] = field(default_factory=dict)

    @property
    def recipe(self) -> str:
        """How the served network was trained: on the likelihood, or distilled."""
        return "distilled" if self.distillation.get("adopted") else "likelihood"

    def metadata(self, feature_names: tuple[str, ...], **extra: Any) -> ReturnModelMetadata:
        return ReturnModelMetadata(
            grid_s=tuple(float(t) for t in self.grid_s),
            inputs=tuple(
                ReturnInput(n, float(m), float(s))
                for n, m, s in zip(feature_names, self.mean, self.std, strict=True)
            ),
            hidden_sizes=tuple(h * self.members for h in self.hidden),
            members=self.members,
            **extra,
        )


def served_layers(networks: list[Any]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The networks side by side as one (`training.ensemble`, "stack": the last layer gives
    each member's logits in turn), as the numpy predictor multiplies: weights (in, out)."""
    from training.ensemble import linear_layers, merge_layers

    layers = merge_layers([linear_layers(network) for network in networks], "stack")
    weights = [np.ascontiguousarray(w.numpy().T, dtype=np.float32) for w, _ in layers]
    biases = [np.ascontiguousarray(b.numpy(), dtype=np.float32) for _, b in layers]
    return weights, biases


def fit_return_model(samples: ReturnSamples, config: ReturnFitConfig) -> ReturnFitResult:
    """Choose the grid and the architecture on the validation slice, then refit on the whole
    training part for the chosen epoch count."""
    check_learnable(samples)  # before torch is imported: a refusal costs no second
    import torch

    torch.set_num_threads(config.threads)
    started = time.perf_counter()
    fit, validation, training = (samples.parts[p] for p in ("fit", "validation", "training"))
    last_s = training_grid_last_s(samples)
    mean, std = _standardisation(fit.features)
    candidates: list[dict[str, Any]] = []
    for count in GRID_COUNTS:
        grid = log_spaced_edges(GRID_FIRST_S, last_s, count)
        train_p = _prepare(fit, grid, mean, std)
        val_p = _prepare(validation, grid, mean, std)
        for hidden in HIDDEN_CANDIDATES:
            _, epoch, nll = train_hazard(
                train_p, val_p, hidden, len(grid) - 1, config, config.max_epochs
            )
            candidates.append(
                {"grid_count": count, "hidden": list(hidden), "epochs": epoch, "val_nll": nll}
            )
    chosen = choose_candidate(candidates)
    grid = log_spaced_edges(GRID_FIRST_S, last_s, chosen["grid_count"])
    hidden = tuple(chosen["hidden"])
    train_p, val_p = _prepare(fit, grid, mean, std), _prepare(validation, grid, mean, std)
    member_epochs, densities = [], []
    for seed in range(config.seed, config.seed + ENSEMBLE_MEMBERS):
        member, epoch, _ = train_hazard(
            train_p, val_p, hidden, len(grid) - 1, replace(config, seed=seed), config.max_epochs
        )
        member_epochs.append(epoch)
        densities.append(_row_log_density(member, val_p))
    ensemble = {
        "members": ENSEMBLE_MEMBERS,
        "member_epochs": member_epochs,
        "single_val_nll": float(-densities[0].mean()),
        "ensemble_val_nll": mixture_nll(densities),
    }
    ensemble["adopted"] = (
        ensemble["single_val_nll"] - ensemble["ensemble_val_nll"] > SIMPLER_MARGIN_NATS
    )
    served_epochs = member_epochs if ensemble["adopted"] else [int(chosen["epochs"])]
    served_val_nll = ensemble["ensemble_val_nll" if ensemble["adopted"] else "single_val_nll"]
    distillation = (
        _distil_candidates(fit, validation, train_p, val_p, grid, config, served_val_nll)
        if config.distil
        else {"tried": False, "adopted": False}
    )
    mean, std = _standardisation(training.features)
    training_p = _prepare(training, grid, mean, std)
    if distillation["adopted"]:
        student = distillation["chosen"]
        hidden = tuple(student["hidden"])
        teacher = HazardTeacher(grid, seed=config.seed).fit(training)
        targets = torch.from_numpy(teacher.logits(training.features).astype(np.float32))
        distillation["served_teacher_iterations"] = teacher.iterations
        network = train_hazard(
            training_p, None, hidden, len(grid) - 1, config, int(student["epochs"]), targets
        )[0]
        weights, biases = served_layers([network])
        served_epochs = [int(student["epochs"])]
        chosen = student
    else:
        networks = [
            train_hazard(
                training_p, None, hidden, len(grid) - 1, replace(config, seed=seed), epochs
            )[0]
            for seed, epochs in zip(
                range(config.seed, config.seed + len(served_epochs)), served_epochs, strict=True
            )
        ]
        weights, biases = served_layers(networks)
    layers = {f"weight {i}": w for i, w in enumerate(weights)}
    bad = non_finite_tensor({**layers, **{f"bias {i}": b for i, b in enumerate(biases)}})
    if bad is not None or not (np.isfinite(mean).all() and np.isfinite(std).all()):
        raise InvalidInputError(
            "non-finite statistics: the fitted network's weights or its inputs' means and "
            "standard deviations are not finite (training diverged); no model is written"
        )
    return ReturnFitResult(
        grid,
        hidden,
        int(chosen["epochs"]),
        weights,
        biases,
        mean,
        std,
        candidates,
        time.perf_counter() - started,
        len(served_epochs),
        ensemble,
        distillation,
    )


def _distil_candidates(
    fit: ReturnPart,
    validation: ReturnPart,
    train_p: _Prepared,
    val_p: _Prepared,
    grid: np.ndarray,
    config: ReturnFitConfig,
    served_val_nll: float,
) -> dict[str, Any]:
    """Students of every `HIDDEN_CANDIDATES` kind, on the chosen grid, regressing onto a
    teacher fitted on the fitting slice; the best by `choose_candidate` is served instead of
    the likelihood-trained model only if its validation NLL is lower by more than
    `SIMPLER_MARGIN_NATS` per row (the teacher is the more complex recipe)."""
    import torch

    try:
        teacher = HazardTeacher(grid, seed=config.seed).fit(fit)
    except ValueError as error:  # e.g. no return seen in the fitting slice
        return {"tried": False, "adopted": False, "reason": str(error)}
    targets = torch.from_numpy(teacher.logits(fit.features).astype(np.float32))
    with torch.no_grad():
        teacher_ll = log_likelihood(
            torch.from_numpy(teacher.logits(validation.features)), val_p.index, val_p.observed
        ).numpy()
    teacher_val_nll = float(-(teacher_ll + val_p.constant).mean())
    students = []
    for hidden in HIDDEN_CANDIDATES:
        _, epoch, nll = train_hazard(
            train_p, val_p, hidden, len(grid) - 1, config, config.max_epochs, targets
        )
        students.append(
            {"grid_count": len(grid) - 1, "hidden": list(hidden), "epochs": epoch, "val_nll": nll}
        )
    chosen = choose_candidate(students)
    return {
        "tried": True,
        "teacher": dict(HAZARD_TEACHER_PARAMS),
        "teacher_iterations": teacher.iterations,
        "teacher_val_nll": teacher_val_nll,
        "students": students,
        "chosen": chosen,
        "likelihood_val_nll": served_val_nll,
        "adopted": served_val_nll - chosen["val_nll"] > SIMPLER_MARGIN_NATS,
    }


def choose_candidate(candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """The lowest validation NLL; a candidate with more hidden layers (then a finer grid)
    is taken only when it beats every simpler one by more than `SIMPLER_MARGIN_NATS`."""

    def complexity(c: dict[str, Any]) -> tuple[int, int, int]:
        return (len(c["hidden"]), sum(c["hidden"]), c["grid_count"])

    best = min(candidates, key=lambda c: c["val_nll"])
    simpler = [
        c
        for c in candidates
        if complexity(c) < complexity(best)
        and c["val_nll"] <= best["val_nll"] + SIMPLER_MARGIN_NATS
    ]
    return min(simpler, key=complexity) if simpler else best


@dataclass(frozen=True)
class TurnKaplanMeier:
    """Kaplan–Meier of the return time per turn (0-based), fitted on the training part;
    turns from `pooled_from` on share one curve."""

    grid_s: np.ndarray
    survival_by_turn: np.ndarray  # (pooled_from + 1, len(grid_s))
    pooled_from: int
    rows_by_turn: tuple[int, ...]

    def survival(self, turns: np.ndarray) -> np.ndarray:
        return self.survival_by_turn[np.minimum(np.asarray(turns), self.pooled_from)]

    def curve(self, turn: int) -> ReturnCurve:
        """The curve of a release at this turn (0-based), as an evictor reads it."""
        return ReturnCurve(self.grid_s, self.survival_by_turn[min(turn, self.pooled_from)])


def fit_turn_kaplan_meier(part: ReturnPart, grid_s: np.ndarray) -> TurnKaplanMeier:
    """Turns 0, 1, … each get their own curve while at least `KM_MIN_ROWS_PER_TURN` training
    rows have that turn; the first turn with fewer starts the pooled tail."""
    turns = part.turn_index
    pooled_from = 0
    while (turns == pooled_from).sum() >= KM_MIN_ROWS_PER_TURN and (
        turns > pooled_from
    ).sum() >= KM_MIN_ROWS_PER_TURN:
        pooled_from += 1
    curves, rows = [], []
    for turn in range(pooled_from + 1):
        mask = turns >= turn if turn == pooled_from else turns == turn
        km = kaplan_meier(part.targets.time_s[mask], part.targets.observed[mask])
        curves.append(km.value_at(grid_s))
        rows.append(int(mask.sum()))
    survival = np.array(curves)
    survival[:, 0] = 1.0
    return TurnKaplanMeier(np.asarray(grid_s, float), survival, pooled_from, tuple(rows))


def km_grid(model_grid_s: np.ndarray) -> np.ndarray:
    """The per-turn baseline's own, finer grid over the model's range."""
    return log_spaced_edges(float(model_grid_s[1]), float(model_grid_s[-1]), KM_GRID_COUNT)
