"""The paper's turns-only ablation (LPC_turns): the continuation rate per turn count.

It answers "how much does the text add?": a predictor that sees only how many user turns a
conversation has had. Fitted on training conversations: for a conversation of T user turns,
turn k (1-based) is a positive sample iff k < T. Counts at or above `max_turn_bin` share one
bin; a count never seen in training gets the overall rate. `majority=True` predicts each bin's
majority label, the paper's LPC_turns; the default predicts the bin's mean, the better
calibrated probability for eviction. One implementation, used by training's metrics and by the
A/B harness (`lpc.replay.probability.TurnsSource`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Self

import numpy as np

DEFAULT_MAX_TURN_BIN = 32


@dataclass
class TurnsBaseline:
    rates: dict[int, float] = field(default_factory=dict)
    base_rate: float = 0.5
    max_turn_bin: int = DEFAULT_MAX_TURN_BIN
    majority: bool = False

    @classmethod
    def fit(
        cls,
        turn_counts: Iterable[int],
        max_turn_bin: int = DEFAULT_MAX_TURN_BIN,
        majority: bool = False,
    ) -> Self:
        """Fit on the user-turn counts of whole conversations (one count per conversation)."""
        if max_turn_bin < 1:
            raise ValueError(f"max_turn_bin must be >= 1, got {max_turn_bin}")
        positives: dict[int, int] = {}
        totals: dict[int, int] = {}
        for num_turns in turn_counts:
            for k in range(1, num_turns + 1):
                b = min(k, max_turn_bin)
                totals[b] = totals.get(b, 0) + 1
                positives[b] = positives.get(b, 0) + (k < num_turns)
        if not totals:
            raise ValueError("cannot fit the turns baseline on zero conversations")
        rates = {b: positives[b] / totals[b] for b in totals}
        base = sum(positives.values()) / sum(totals.values())
        return cls(rates, base, max_turn_bin, majority)

    def rate(self, turn_count: int) -> float:
        """The prediction for a turn whose 1-based index (user turns so far) is `turn_count`."""
        rate = self.rates.get(min(turn_count, self.max_turn_bin), self.base_rate)
        return float(rate >= 0.5) if self.majority else rate

    def predict_counts(self, turn_counts: Sequence[int] | np.ndarray) -> np.ndarray:
        return np.fromiter(
            (self.rate(int(c)) for c in turn_counts), dtype=np.float64, count=len(turn_counts)
        )
