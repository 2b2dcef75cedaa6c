"""Where LPC's continuation probabilities come from: one interface, several sources.

A source answers, for a batch of turns, the probability that each conversation continues
after that turn (None: no prediction, the evictor falls back). Predictions depend only on the
conversation, never on the cache, so a replay computes them once for every policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from eviction import check_probability
from lpc.workload import ScriptedTurn


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
class TurnsSource:
    """The paper's turns-only ablation: the continuation rate per turn count.

    Fitted on the training half: for a conversation of T user turns, turn k (1-based) is a
    positive sample iff k < T. Counts at or above `max_turn_bin` share one bin. `majority`
    predicts the bin's majority label (the paper's LPC_turns); by default the bin's mean,
    which is the better-calibrated probability for eviction.
    """

    rates: dict[int, float] = field(default_factory=dict)
    base_rate: float = 0.5
    max_turn_bin: int = 32
    majority: bool = False
    name: str = "turns"

    @classmethod
    def fit(
        cls, turn_counts: Iterable[int], max_turn_bin: int = 32, majority: bool = False
    ) -> TurnsSource:
        positives: dict[int, int] = {}
        totals: dict[int, int] = {}
        for num_turns in turn_counts:
            for k in range(1, num_turns + 1):
                b = min(k, max_turn_bin)
                totals[b] = totals.get(b, 0) + 1
                positives[b] = positives.get(b, 0) + (k < num_turns)
        if not totals:
            raise ValueError("cannot fit the turns source on zero conversations")
        rates = {b: positives[b] / totals[b] for b in totals}
        base = sum(positives.values()) / sum(totals.values())
        return cls(rates, base, max_turn_bin, majority)

    def rate(self, turn_count: int) -> float:
        rate = self.rates.get(min(turn_count, self.max_turn_bin), self.base_rate)
        return float(rate >= 0.5) if self.majority else rate

    def predict(self, turns: Sequence[ScriptedTurn]) -> list[float | None]:
        return [self.rate(turn.turn_index + 1) for turn in turns]
