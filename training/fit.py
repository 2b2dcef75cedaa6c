"""How the text model's MLP is trained: class-weighted BCE, Adam, the lowest validation loss.

The paper's recipe (Adam, learning rate 5e-4, at most 20 epochs, the weights with the lowest
validation loss), with early stopping after `patience` epochs, through the loop the access and
return models train with (`training.loop`); seeded and deterministic on CPU. `accelerator`
picks the one device the fit runs on: `cpu`, `gpu` (or `cuda`), or `auto`.

Why class weights: docs/design.md, "The text model's fit".
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from predictor.errors import InvalidInputError
from predictor.model import ContinuationMLP, MLPConfig

CLASS_WEIGHTINGS = ("balanced", "none")
ACCELERATORS = ("cpu", "gpu", "cuda", "auto")
VALIDATION_BATCH = 4096  # rows per validation batch: the loss's sums depend on it


@dataclass(frozen=True)
class FitConfig:
    learning_rate: float = 5e-4
    max_epochs: int = 20
    patience: int = 5
    batch_size: int = 256
    class_weighting: str = "balanced"
    seed: int = 0
    accelerator: str = "cpu"
    num_threads: int | None = 1  # the MLP is too small to gain from more; None: torch's default

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return InvalidInputError(f"FitConfig.{name} {why}, got {getattr(self, name)!r}")

        if not isinstance(self.learning_rate, int | float) or not self.learning_rate > 0:
            raise bad("learning_rate", "must be a number > 0")
        for name in ("max_epochs", "patience", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(name, "must be a positive integer")
        if self.class_weighting not in CLASS_WEIGHTINGS:
            raise bad("class_weighting", f"must be one of {CLASS_WEIGHTINGS}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise bad("seed", "must be an integer")
        if self.accelerator not in ACCELERATORS:
            raise bad("accelerator", f"must be one of {ACCELERATORS}")
        if self.num_threads is not None and (
            not isinstance(self.num_threads, int) or self.num_threads < 1
        ):
            raise bad("num_threads", "must be a positive integer or None")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FitResult:
    model: ContinuationMLP  # the best checkpoint's weights, in eval mode
    best_epoch: int  # 0-based
    best_val_loss: float
    epochs_run: int
    class_weights: tuple[float, float]
    val_losses: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "best_epoch": self.best_epoch,
            "best_val_loss": round(self.best_val_loss, 6),
            "epochs_run": self.epochs_run,
            "class_weights": [round(w, 6) for w in self.class_weights],
            "val_losses": [round(v, 6) for v in self.val_losses],
            "seconds": round(self.seconds, 3),
        }


def balanced_class_weights(labels: Any) -> tuple[float, float]:
    """(weight of class 0, weight of class 1) = n / (2 · n_class) of a 0/1 label tensor;
    (1, 1) when a class is absent (nothing to balance)."""
    n = int(labels.numel())
    positives = int(labels.sum().item())
    negatives = n - positives
    if not positives or not negatives:
        return 1.0, 1.0
    return float(n / (2 * negatives)), float(n / (2 * positives))


class WeightedBCE:
    """BCE on logits, each row weighted by its class, normalised by the weights' sum."""

    def __init__(self, class_weights: tuple[float, float], device: Any = "cpu") -> None:
        import torch

        self.class_weights = torch.tensor(class_weights, dtype=torch.float32, device=device)

    def __call__(self, logits: Any, labels: Any) -> Any:
        import torch

        weights = self.class_weights[labels.long()]
        losses = torch.nn.functional.binary_cross_entropy_with_logits(
            logits, labels, reduction="none"
        )
        return (losses * weights).sum() / weights.sum()


def training_device(accelerator: str) -> Any:
    """The torch device of an `accelerator` name; a GPU asked for but absent is refused."""
    import torch

    if accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InvalidInputError(f"accelerator {accelerator!r}: torch sees no GPU on this machine")
    return torch.device("cuda")


def fit_mlp(
    train_inputs: np.ndarray,
    train_labels: np.ndarray,
    val_inputs: np.ndarray,
    val_labels: np.ndarray,
    mlp_config: MLPConfig,
    config: FitConfig,
) -> FitResult:
    """Train a `ContinuationMLP` on precomputed inputs; return the lowest-val-loss weights."""
    import torch

    if train_inputs.shape[1] != mlp_config.input_dim:
        raise ValueError(
            f"inputs have {train_inputs.shape[1]} columns, the MLP expects {mlp_config.input_dim}"
        )
    started = time.perf_counter()
    threads = torch.get_num_threads()
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    try:
        return _fit(train_inputs, train_labels, val_inputs, val_labels, mlp_config, config, started)
    finally:
        torch.set_num_threads(threads)


def _fit(
    train_inputs: np.ndarray,
    train_labels: np.ndarray,
    val_inputs: np.ndarray,
    val_labels: np.ndarray,
    mlp_config: MLPConfig,
    config: FitConfig,
    started: float,
) -> FitResult:
    import torch

    from training.loop import loader_batches, loader_pass, train_loop

    device = training_device(config.accelerator)
    train_x, train_y = _tensors("training", train_inputs, train_labels, device)
    val_x, val_y = _tensors("validation", val_inputs, val_labels, device)
    weights = (
        balanced_class_weights(train_y) if config.class_weighting == "balanced" else (1.0, 1.0)
    )
    loss = WeightedBCE(weights, device)
    torch.manual_seed(config.seed)
    model = ContinuationMLP(mlp_config).to(device)

    def batch_loss(model: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
        rows = rows.to(device)
        return loss(model(train_x[rows]), train_y[rows])

    def validation(model: torch.nn.Module) -> float:
        # Each batch's loss weighted by its row count, in float32: the epoch mean the shipped
        # text models were chosen by, so the same sums give the same checkpoint bit for bit.
        total, count = torch.tensor(0.0, device=device), torch.tensor(0, device=device)
        for rows in loader_pass(len(val_y), VALIDATION_BATCH):
            rows = rows.to(device)
            total = total + loss(model(val_x[rows]), val_y[rows]) * len(rows)
            count = count + len(rows)
        return float(total / count)

    generator = torch.Generator().manual_seed(config.seed)
    result = train_loop(
        model,
        batch_loss,
        loader_batches(len(train_y), config.batch_size, generator),
        learning_rate=config.learning_rate,
        max_epochs=config.max_epochs,
        patience=config.patience,
        min_improvement=0.0,
        validation=validation,
    )
    losses = result.val_losses
    return FitResult(
        model=model.cpu().eval(),
        best_epoch=int(np.argmin(losses)) if losses else 0,
        best_val_loss=float(min(losses)) if losses else float("nan"),
        epochs_run=len(losses),
        class_weights=weights,
        val_losses=losses,
        seconds=time.perf_counter() - started,
    )


def _tensors(name: str, inputs: np.ndarray, labels: np.ndarray, device: Any):
    import torch

    if len(inputs) != len(labels):
        raise ValueError(f"{name}: {len(inputs)} input rows but {len(labels)} labels")
    if len(inputs) == 0:
        raise ValueError(f"{name}: no samples")
    return (
        torch.from_numpy(np.ascontiguousarray(inputs, np.float32)).to(device),
        torch.from_numpy(np.asarray(labels, np.float32)).to(device),
    )
