"""How the MLP is trained: the Lightning `Trainer`, checkpointing and early stopping.

The paper's recipe: Adam, learning rate 5e-4, at most 20 epochs, keep the checkpoint with the
lowest validation loss. We stop early once the validation loss has not improved for
`patience` epochs (the best checkpoint is kept either way). Runs are seeded and deterministic
on CPU (`Trainer(deterministic=True)`, seeded shuffling): one seed, one model, bit for bit.

Scaling out: `accelerator`, `devices` and `strategy` go straight to Lightning, e.g.
`accelerator="gpu", devices=4, strategy="ddp"` on a multi-GPU box (see docs/training.md).
"""

from __future__ import annotations

import logging
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from predictor.errors import InvalidInputError
from predictor.model import ContinuationMLP, MLPConfig

CLASS_WEIGHTINGS = ("balanced", "none")


@dataclass(frozen=True)
class FitConfig:
    learning_rate: float = 5e-4
    max_epochs: int = 20
    patience: int = 5
    batch_size: int = 256
    class_weighting: str = "balanced"
    seed: int = 0
    accelerator: str = "cpu"
    devices: int | str = 1
    strategy: str = "auto"
    num_threads: int | None = 1  # the MLP is too small to gain from more; None: torch's default
    progress: bool = False

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


def _quiet_lightning() -> None:
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*number of training batches.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")


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
    _quiet_lightning()
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
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint

    from training.datamodule import ArrayDataModule
    from training.lightning_module import ContinuationModule, balanced_class_weights

    pl.seed_everything(config.seed, workers=True, verbose=False)
    data = ArrayDataModule(
        train_inputs, train_labels, val_inputs, val_labels, config.batch_size, config.seed
    )
    weights = (
        balanced_class_weights(data.train_labels)
        if config.class_weighting == "balanced"
        else (1.0, 1.0)
    )
    module = ContinuationModule(mlp_config, config.learning_rate, weights)
    losses: list[float] = []

    class RecordValLoss(Callback):
        def on_validation_epoch_end(self, trainer, pl_module) -> None:
            if not trainer.sanity_checking:
                losses.append(float(trainer.callback_metrics["val_loss"]))

    with tempfile.TemporaryDirectory(prefix="lpc-train-") as folder:
        checkpoint = ModelCheckpoint(
            dirpath=folder,
            monitor="val_loss",
            mode="min",
            save_top_k=1,
            save_weights_only=True,
            filename="best-{epoch}",
        )
        trainer = pl.Trainer(
            accelerator=config.accelerator,
            devices=config.devices,
            strategy=config.strategy,
            max_epochs=config.max_epochs,
            deterministic=True,
            callbacks=[
                checkpoint,
                EarlyStopping("val_loss", patience=config.patience, mode="min"),
                RecordValLoss(),
            ],
            logger=False,
            enable_progress_bar=config.progress,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=folder,
        )
        trainer.fit(module, datamodule=data)
        best = torch.load(checkpoint.best_model_path, map_location="cpu", weights_only=True)
        module.load_state_dict(best["state_dict"])
    model = module.model.cpu().eval()
    best_epoch = int(np.argmin(losses)) if losses else 0
    return FitResult(
        model=model,
        best_epoch=best_epoch,
        best_val_loss=float(min(losses)) if losses else float("nan"),
        epochs_run=len(losses),
        class_weights=weights,
        val_losses=losses,
        seconds=time.perf_counter() - started,
    )
