"""The one minibatch training loop of the text, access and return models.

Each model brings its network, its loss on a batch of row numbers and, when early stopping,
its validation loss; the loop runs the epochs, keeps the state of the best epoch and loads it
back. The order of the rows has two seeded forms (`permuted_batches`, `loader_batches`), each
kept because the shipped models were trained with it.

The loop and the two orders: docs/design.md, "The training loop".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

BatchLoss = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]  # (model, rows) → loss
Validation = Callable[[torch.nn.Module], float]  # model in eval mode → validation loss
EpochOrder = Callable[[], Iterable[torch.Tensor]]  # one epoch's batches of row numbers


@dataclass
class LoopResult:
    model: torch.nn.Module  # the kept state, in eval mode
    best_epoch: int  # 1-based; `max_epochs` when nothing was validated or nothing improved
    best_loss: float  # inf when nothing was validated
    val_losses: list[float] = field(default_factory=list)  # one per epoch run, when validated


def permuted_batches(rows: int, batch_size: int, generator: torch.Generator) -> EpochOrder:
    """Per epoch one permutation of the rows from `generator`, in batches of `batch_size`."""

    def epoch() -> Iterable[torch.Tensor]:
        order = torch.randperm(rows, generator=generator)
        return [order[start : start + batch_size] for start in range(0, rows, batch_size)]

    return epoch


def loader_batches(rows: int, batch_size: int, generator: torch.Generator) -> EpochOrder:
    """Per epoch a pass of a shuffling `DataLoader` over the row numbers, seeded by
    `generator` (the text model's order)."""
    from torch.utils.data import DataLoader

    loader = DataLoader(
        torch.arange(rows), batch_size=batch_size, shuffle=True, generator=generator
    )
    batches = len(loader)
    # Exactly `batches` taken, never the end-of-pass signal: when the rows fill the batches
    # exactly, asking for one more would draw the sampler's second permutation, which the
    # shipped text models were not trained with.
    return lambda: itertools.islice(loader, batches)


def loader_pass(rows: int, batch_size: int) -> Iterable[torch.Tensor]:
    """The row numbers in order, in batches, through an unshuffled `DataLoader`."""
    from torch.utils.data import DataLoader

    return DataLoader(torch.arange(rows), batch_size=batch_size, shuffle=False)


def train_loop(
    model: torch.nn.Module,
    batch_loss: BatchLoss,
    order: EpochOrder,
    *,
    learning_rate: float,
    max_epochs: int,
    patience: int = 1,
    min_improvement: float = 1e-5,
    validation: Validation | None = None,
) -> LoopResult:
    """Train `model` in place with Adam; return it with the kept state loaded, in eval mode.

    `max_epochs`: the most epochs with a `validation` loss, exactly this many without one;
    `patience`: epochs without improvement before stopping; `min_improvement`: how much lower
    a validation loss must be to count. The callers' fit settings (`FitConfig`,
    `AccessFitConfig`, `ReturnFitConfig`) pass their own values straight through."""
    optimiser = torch.optim.Adam(model.parameters(), lr=learning_rate)
    best_loss, best_state, best_epoch, stale = math.inf, None, max_epochs, 0
    losses: list[float] = []
    for epoch in range(1, max_epochs + 1):
        model.train()
        for rows in order():
            optimiser.zero_grad()
            batch_loss(model, rows).backward()
            optimiser.step()
        if validation is None:
            continue
        model.eval()
        with torch.no_grad():
            loss = validation(model)
        losses.append(loss)
        if loss < best_loss - min_improvement:
            best_loss, best_epoch, stale = loss, epoch, 0
            best_state = _copy_state(model)
        else:
            stale += 1
            if stale >= patience or not math.isfinite(loss):
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return LoopResult(model, best_epoch, best_loss, losses)


def _copy_state(model: torch.nn.Module) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
