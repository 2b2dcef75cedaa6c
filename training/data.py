"""From conversations to the three sample sets training needs: train, validation, evaluation.

The evaluation half is `training.split`'s (also the A/B harness's), never seen in training;
the training half is cut again, by another stable hash of the conversation's split key, into
the samples the MLP learns from and the validation samples that pick its checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from predictor.errors import InvalidInputError
from training.conversation import Conversation
from training.samples import (
    DEFAULT_VALIDATION_FRACTION,
    TokenCounts,
    TurnSample,
    build_samples,
    samples_fingerprint,
    validation_mask,
    with_token_counts,
)
from training.split import partition_conversations


@dataclass(frozen=True)
class SampleSplit:
    train: list[TurnSample]
    validation: list[TurnSample]
    evaluation: list[TurnSample]
    train_conversations: int
    evaluation_conversations: int

    @property
    def training_half(self) -> list[TurnSample]:
        """Train and validation samples: what a model may learn from."""
        return self.train + self.validation

    def fingerprint(self) -> str:
        """Names the training half (train + validation samples, their labels and texts)."""
        return samples_fingerprint(self.training_half)

    def counts(self) -> dict[str, int | float]:
        def positives(samples: Sequence[TurnSample]) -> int:
            return sum(s.label for s in samples)

        return {
            "train_conversations": self.train_conversations,
            "evaluation_conversations": self.evaluation_conversations,
            "train_samples": len(self.train),
            "validation_samples": len(self.validation),
            "evaluation_samples": len(self.evaluation),
            "train_positive_rate": round(positives(self.train) / max(len(self.train), 1), 6),
            "evaluation_positive_rate": round(
                positives(self.evaluation) / max(len(self.evaluation), 1), 6
            ),
        }


def split_samples(
    conversations: Sequence[Conversation],
    window_size: int,
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION,
    with_evaluation: bool = True,
) -> SampleSplit:
    """Samples of the training half (cut into train/validation) and of the evaluation half."""
    halves = partition_conversations(conversations)
    training = build_samples(halves.train, window_size)
    mask = validation_mask(training, validation_fraction)
    train = [s for s, v in zip(training, mask, strict=True) if not v]
    validation = [s for s, v in zip(training, mask, strict=True) if v]
    if not train or not validation:
        raise InvalidInputError(
            f"the training half gives {len(train)} training and {len(validation)} validation "
            f"samples; both must be non-empty (more conversations, or another "
            f"validation_fraction than {validation_fraction})"
        )
    evaluation = build_samples(halves.eval, window_size) if with_evaluation else []
    return SampleSplit(train, validation, evaluation, len(halves.train), len(halves.eval))


def attach_token_counts(split: SampleSplit, counts: TokenCounts) -> tuple[SampleSplit, int]:
    """The split with serving token counts on every sample; samples without counts (turns the
    serving engine never sees) are left out, and their number returned."""
    train, a = with_token_counts(split.train, counts)
    validation, b = with_token_counts(split.validation, counts)
    evaluation, c = with_token_counts(split.evaluation, counts)
    return SampleSplit(
        train, validation, evaluation, split.train_conversations, split.evaluation_conversations
    ), a + b + c


def positive_rate(samples: Sequence[TurnSample]) -> float:
    if not samples:
        raise ValueError("no samples")
    return float(np.mean([s.label for s in samples]))
