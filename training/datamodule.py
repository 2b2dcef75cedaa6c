"""The data side of training: in-memory MLP inputs and labels as Lightning data loaders.

Inputs are precomputed (cached embeddings + scalar columns), so an epoch is a pass over a
float32 matrix; loaders use no worker processes (the cost of forking exceeds the work). The
shuffle order comes from a generator seeded with the run's seed, so two runs with one seed see
identical batches.
"""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


class ArrayDataModule(pl.LightningDataModule):
    """Training and validation arrays → loaders (`batch_size` rows, training shuffled)."""

    def __init__(
        self,
        train_inputs: np.ndarray,
        train_labels: np.ndarray,
        val_inputs: np.ndarray,
        val_labels: np.ndarray,
        batch_size: int = 256,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        for name, inputs, labels in (
            ("training", train_inputs, train_labels),
            ("validation", val_inputs, val_labels),
        ):
            if len(inputs) != len(labels):
                raise ValueError(f"{name}: {len(inputs)} input rows but {len(labels)} labels")
            if len(inputs) == 0:
                raise ValueError(f"{name}: no samples")
        self.train_set = TensorDataset(
            torch.from_numpy(np.ascontiguousarray(train_inputs, np.float32)),
            torch.from_numpy(np.asarray(train_labels, np.float32)),
        )
        self.val_set = TensorDataset(
            torch.from_numpy(np.ascontiguousarray(val_inputs, np.float32)),
            torch.from_numpy(np.asarray(val_labels, np.float32)),
        )
        self.batch_size = batch_size
        self.seed = seed

    @property
    def train_labels(self) -> torch.Tensor:
        return self.train_set.tensors[1]

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.train_set, batch_size=self.batch_size, shuffle=True, generator=generator
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=4096, shuffle=False)
