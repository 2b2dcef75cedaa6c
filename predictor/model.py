"""The continuation classifier: the paper's MLP, 3 hidden layers of 128 units.

Input: the window embedding (384 for e5-small) with the encoded turn count appended as one more
column (see `features.encode_turn_counts`: log(1 + turns) by default). A model trained with
optional scalars (`MLPConfig.extra_features`, records of the feature registry
`predictor.access_features`) takes them between the embedding and the turn column; the paper's
model has none. Output: one logit; the
probability that the conversation continues is its sigmoid. Logits (not probabilities) leave
the module so that training can use the numerically stable BCE-with-logits loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from predictor.mlp_config import DEFAULT_HIDDEN_SIZES, MLPConfig

__all__ = ["DEFAULT_HIDDEN_SIZES", "ContinuationMLP", "MLPConfig", "input_matrix", "mlp_inputs"]


class ContinuationMLP(nn.Module):
    """Linear → ReLU (→ Dropout) per hidden layer, then a linear layer to one logit."""

    def __init__(self, config: MLPConfig | None = None) -> None:
        super().__init__()
        self.config = config or MLPConfig()
        layers: list[nn.Module] = []
        width = self.config.input_dim
        for hidden in self.config.hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            if self.config.dropout > 0:
                layers.append(nn.Dropout(self.config.dropout))
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.layers = nn.Sequential(*layers)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """(n, input_dim) float32 → (n,) logits."""
        if inputs.ndim != 2 or inputs.shape[1] != self.config.input_dim:
            raise ValueError(
                f"expected inputs of shape (n, {self.config.input_dim}), got {tuple(inputs.shape)}"
            )
        return self.layers(inputs).squeeze(-1)


def input_matrix(
    embeddings: np.ndarray,
    encoded_turns: np.ndarray | Sequence[float],
    extras: np.ndarray | None = None,
) -> np.ndarray:
    """float32 rows: embedding (n, d), extra features (n, k) if any, encoded turn column."""
    embeddings = np.asarray(embeddings, dtype=np.float32)
    turns = np.asarray(encoded_turns, dtype=np.float32).reshape(-1, 1)
    if embeddings.ndim != 2 or embeddings.shape[0] != turns.shape[0]:
        raise ValueError(
            f"embeddings {embeddings.shape} and turn counts {turns.shape[0]} do not line up"
        )
    parts = [embeddings]
    if extras is not None:
        extras = np.asarray(extras, dtype=np.float32)
        if extras.ndim != 2 or extras.shape[0] != embeddings.shape[0]:
            raise ValueError(
                f"extra features {extras.shape} do not line up with "
                f"{embeddings.shape[0]} embeddings"
            )
        parts.append(extras)
    parts.append(turns)
    return np.concatenate(parts, axis=1)


def mlp_inputs(
    embeddings: np.ndarray,
    encoded_turns: np.ndarray | Sequence[float],
    extras: np.ndarray | None = None,
) -> torch.Tensor:
    """`input_matrix` as a tensor: the MLP's input."""
    return torch.from_numpy(input_matrix(embeddings, encoded_turns, extras))
