"""Where LPC's continuation probabilities come from: one interface, several sources.

A source answers, for a batch of turns, the probability that each conversation continues
after that turn (None: no prediction, the evictor falls back). Predictions depend only on the
conversation, never on the cache, so a replay computes them once for every policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from eviction import check_probability
from lpc.workload import ScriptedTurn
from training.turns_baseline import TurnsBaseline


class ProbabilitySource(Protocol):
    name: str

    def predict(self, turns: Sequence[ScriptedTurn]) -> list[float | None]: ...


@dataclass(frozen=True)
class ConstantSource:
    """The same p for every turn: LPC then orders blocks by release time alone, like LRU."""

    probability: float = 0.5
    name: str = "const"

    def __post_init__(self) -> None:
        check_probability(self.probability, "constant probability")

    def predict(self, turns: Sequence[ScriptedTurn]) -> list[float | None]:
        return [self.probability] * len(turns)


@dataclass(frozen=True)
class OracleSource:
    """The true label: 1 if the conversation has another user turn, else 0 (an upper bound)."""

    name: str = "oracle"

    def predict(self, turns: Sequence[ScriptedTurn]) -> list[float | None]:
        return [1.0 if turn.has_next_turn else 0.0 for turn in turns]


@dataclass
class TurnsSource(TurnsBaseline):
    """The paper's turns-only ablation as a probability source: the continuation rate per
    turn count, fitted on the training half (`training.turns_baseline.TurnsBaseline`, shared
    with training's metrics). `majority=True` is the paper's LPC_turns; by default the bin's
    mean, which is the better-calibrated probability for eviction.
    """

    name: str = "turns"

    def predict(self, turns: Sequence[ScriptedTurn]) -> list[float | None]:
        return [self.rate(turn.turn_index + 1) for turn in turns]
