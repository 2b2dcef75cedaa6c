"""The continuation classifier: the paper's MLP, 3 hidden layers of 128 units.

Input: the window embedding (384 for e5-small) with the encoded turn count appended as one more
column (see `features.encode_turn_counts`: log(1 + turns) by default). A model trained with
optional finish-time scalars (`MLPConfig.extra_features`, names defined by
`training.finish_features`) takes them between the embedding and the turn column; the paper's
model has none. Output: one logit; the
probability that the conversation continues is its sigmoid. Logits (not probabilities) leave
the module so that training can use the numerically stable BCE-with-logits loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

DEFAULT_HIDDEN_SIZES = (128, 128, 128)


@dataclass(frozen=True)
class MLPConfig:
    embedding_dim: int = 384
    hidden_sizes: tuple[int, ...] = DEFAULT_HIDDEN_SIZES
    dropout: float = 0.0
    extra_features: tuple[str, ...] = ()  # named scalar columns after the embedding
    # The text model ends with the encoded turn count; an access-only model (no embedding,
    # `predictor.access_features` as its extra features) has no such column.
    turn_column: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        object.__setattr__(self, "extra_features", tuple(self.extra_features))
        if not all(isinstance(n, str) and n for n in self.extra_features) or len(
            set(self.extra_features)
        ) != len(self.extra_features):
            raise ValueError(
                f"MLPConfig.extra_features must be distinct non-empty names, "
                f"got {self.extra_features!r}"
            )
        if not isinstance(self.embedding_dim, int) or self.embedding_dim < 0:
            raise ValueError(
                f"MLPConfig.embedding_dim must be an integer >= 0, got {self.embedding_dim!r}"
            )
        if self.input_dim < 1:
            raise ValueError("MLPConfig has no input: no embedding, extra features or turn column")
        if not self.hidden_sizes or any(not isinstance(h, int) or h < 1 for h in self.hidden_sizes):
            raise ValueError(
                f"MLPConfig.hidden_sizes must be positive integers, got {self.hidden_sizes!r}"
            )
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"MLPConfig.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def input_dim(self) -> int:
        """Embedding, extra features, and the turn-count column (when it has one)."""
        return self.embedding_dim + len(self.extra_features) + int(self.turn_column)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["hidden_sizes"] = list(self.hidden_sizes)
        # Absent when empty: artifacts of models without extras keep their original shape.
        extras = data.pop("extra_features")
        if extras:
            data["extra_features"] = list(extras)
        if data["turn_column"]:
            del data["turn_column"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MLPConfig:
        return cls(
            int(data["embedding_dim"]),
            tuple(int(h) for h in data["hidden_sizes"]),
            float(data.get("dropout", 0.0)),
            tuple(str(n) for n in data.get("extra_features", ())),
            bool(data.get("turn_column", True)),
        )


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
