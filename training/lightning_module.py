"""What is learned: the continuation MLP, its class-weighted loss and its optimiser.

Lightning keeps *what* (this module) apart from *data* (`training.datamodule`) and from *how it
runs* (`training.fit`: devices, checkpoints, early stopping), so the same module trains on one
CPU core or with DDP on several GPUs.

The loss is binary cross-entropy on logits with per-class weights: in chat data most turns are
followed by another one (≈ 71 % in ShareGPT), and without up-weighting the minority class the
MLP drifts towards "always continues". Weights `n / (2 · n_class)` make both classes count
equally; the order of the outputs — all the evictor uses — is unaffected by the resulting
shift of the probabilities (see `training.metrics.prior_shift`).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn

from predictor.model import ContinuationMLP, MLPConfig


def balanced_class_weights(labels: torch.Tensor) -> tuple[float, float]:
    """(weight of class 0, weight of class 1) = n / (2 · n_class); (1, 1) when a class is
    absent (nothing to balance)."""
    n = int(labels.numel())
    positives = int(labels.sum().item())
    negatives = n - positives
    if not positives or not negatives:
        return 1.0, 1.0
    return float(n / (2 * negatives)), float(n / (2 * positives))


class ContinuationModule(pl.LightningModule):
    """`ContinuationMLP` + weighted BCE-with-logits + Adam.

    Batches are `(inputs, labels)`: inputs of shape (n, mlp_config.input_dim) as built by
    `training.pipeline.model_inputs` (`predictor.model.input_matrix`), labels 0/1 floats.
    `val_loss` (same weighting) drives checkpointing and early stopping.
    """

    def __init__(
        self,
        mlp_config: MLPConfig,
        learning_rate: float = 5e-4,
        class_weights: tuple[float, float] = (1.0, 1.0),
    ) -> None:
        super().__init__()
        if not learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate!r}")
        self.model = ContinuationMLP(mlp_config)
        self.learning_rate = learning_rate
        self.register_buffer("class_weights", torch.tensor(class_weights, dtype=torch.float32))
        self.loss = nn.BCEWithLogitsLoss(reduction="none")

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs)

    def weighted_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        weights = self.class_weights[labels.long()]
        return (self.loss(logits, labels) * weights).sum() / weights.sum()

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        inputs, labels = batch
        loss = self.weighted_loss(self(inputs), labels)
        self.log("train_loss", loss, on_step=False, on_epoch=True, batch_size=labels.numel())
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        inputs, labels = batch
        loss = self.weighted_loss(self(inputs), labels)
        self.log(
            "val_loss",
            loss,
            on_step=False,
            on_epoch=True,
            prog_bar=True,
            batch_size=labels.numel(),
            sync_dist=True,
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)
