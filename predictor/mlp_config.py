"""The MLP's configuration, without torch: artifacts are read (and access-only models run, in
numpy) by processes that never import torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

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
