"""The learned probability source of the A/B harness: a trained predictor over cached embeddings.

For each replayed turn it builds the predictor's window, embeds it through the embedding cache
that training filled (missing turns are embedded once, with a progress bar, and kept), and
runs the MLP in batches — the same `Predictor` code the RPC server runs, so the A/B measures
what would be deployed. A model trained with extra features also needs each finishing
request's size and reply.

Where those features come from: docs/design.md, "The learned source".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lpc.errors import InvalidInputError
from lpc.workload import ScriptedTurn
from predictor.access_features import feature, sample_matrix
from training.conversation import Conversation
from training.embedding_cache import EmbeddingCache, EmbedOptions, EmbedStats
from training.samples import TokenCounts, TurnSample, conversation_samples

if TYPE_CHECKING:
    # torch comes with it (seconds): imported when a model is loaded, so that a bad data set
    # is refused before then.
    from predictor.predictor import Predictor

PREDICT_BATCH = 4096


@dataclass
class LearnedSource:
    predictor: Predictor
    cache: EmbeddingCache
    embed_options: EmbedOptions = field(default_factory=EmbedOptions)
    conversations: dict[str, Conversation] = field(default_factory=dict)
    name: str = "model"
    stats: EmbedStats = field(default_factory=EmbedStats)

    def __post_init__(self) -> None:
        self._samples: dict[str, list[TurnSample]] = {}

    def _features_sample(self, turn: ScriptedTurn) -> TurnSample:
        """What the finish features read: the request's serving token counts, and, when the
        model has character features, the conversation's text."""
        tokens = {"request_tokens": len(turn.token_ids), "output_tokens": turn.num_output_tokens}
        if all(feature(n).sample_needs_token_counts for n in self.predictor.extra_features):
            return TurnSample(
                turn.conversation_id,
                "",
                turn.turn_index + 1,
                int(turn.has_next_turn),
                tuple(turn.user_prompts),
                "",
                0,
                **tokens,
            )
        return replace(self._sample(turn), **tokens)

    def _sample(self, turn: ScriptedTurn) -> TurnSample:
        conversation_id = turn.conversation_id
        if conversation_id not in self._samples:
            conversation = self.conversations.get(conversation_id)
            if conversation is None:
                raise InvalidInputError(
                    f"the model needs finish-time features {list(self.predictor.extra_features)}"
                    f" but conversation {conversation_id!r} is not among the loaded ones (a "
                    "trace replay has no replies to compute them from)"
                )
            window_size = self.predictor.feature_config.window_size
            self._samples[conversation_id] = conversation_samples(conversation, window_size)
        return self._samples[conversation_id][turn.turn_index]

    def _windows(self, turns: Sequence[ScriptedTurn]) -> list[Sequence[str]]:
        size = self.predictor.feature_config.window_size
        windows: list[Sequence[str]] = []
        for turn in turns:
            if len(turn.user_prompts) >= size or len(turn.user_prompts) == turn.turn_index + 1:
                windows.append(turn.user_prompts)
            else:  # the turn carries fewer prompts than this model's window: rebuild it
                windows.append(self._sample(turn).window)
        return windows

    def predict(self, turns: Sequence[ScriptedTurn]) -> list[float | None]:
        if not turns:
            return []
        config = self.predictor.feature_config
        out = np.empty(len(turns), dtype=np.float64)
        for start in range(0, len(turns), PREDICT_BATCH):
            batch = turns[start : start + PREDICT_BATCH]
            embeddings = self.cache.embeddings_for(
                self._windows(batch), config, self.embed_options, self.stats
            )
            extras = None
            if self.predictor.extra_features:
                extras = sample_matrix(
                    [self._features_sample(t) for t in batch], self.predictor.extra_features
                )
            out[start : start + len(batch)] = self.predictor.predict_from_embeddings(
                embeddings, [t.turn_index + 1 for t in batch], extras
            )
        return [float(p) for p in out]


class ServingTokenCounter:
    """`training.samples.TokenCounter` over the A/B harness's own tokenisation (the serving
    tokenizer, ChatML, max_model_len, through the on-disk token cache): the request sizes a
    model trained with token finish features sees in training are the ones it sees replayed."""

    def __init__(
        self, tokenizer=None, max_model_len: int | None = None, progress: bool = True
    ) -> None:
        from lpc.chat.tokenization import DEFAULT_MAX_MODEL_LEN, TEMPLATE_VERSION
        from lpc.chat.tokenizers import default_chat_tokenizer

        self.tokenizer = tokenizer or default_chat_tokenizer()
        self.max_model_len = max_model_len or DEFAULT_MAX_MODEL_LEN
        self.progress = progress
        self.name = f"{self.tokenizer.name}+{TEMPLATE_VERSION}+max_model_len={self.max_model_len}"

    def __call__(self, conversations: Sequence[Conversation]) -> TokenCounts:
        from lpc.chat.token_cache import tokenize_conversations_cached

        tokenized = tokenize_conversations_cached(
            conversations, self.tokenizer, self.max_model_len, progress=self.progress
        )
        return {
            (turn.conversation_id, turn.turn_index): (
                turn.num_request_tokens,
                turn.num_output_tokens,
            )
            for conversation in tokenized.conversations
            for turn in conversation.turns
        }


def learned_source_factory(
    model: Path, cache_dir: Path, embed_options: EmbedOptions, device: str | None = None, log=print
):
    """A `ModelSourceFactory` for `lpc.replay.ab_run.run_ab`: loads the predictor (and its
    embedder) when the harness needs it, with the evaluation conversations for lookups."""

    def factory(context) -> LearnedSource:
        from predictor.predictor import Predictor

        predictor = Predictor.load(model, device=device)
        metadata = predictor.artifact.metadata
        cache = EmbeddingCache.open(
            cache_dir, predictor.embedder_id, predictor.embedder.dim, embedder=predictor.embedder
        )
        evaluation = getattr(context, "eval_conversations", None) or []
        log(
            f"model: {model} ({metadata.embedder_id}; "
            + (
                f"evaluation MCC {metadata.metrics['evaluation']['mcc']:.3f}, "
                f"AUC {metadata.metrics['evaluation']['roc_auc']:.3f}"
                if "evaluation" in metadata.metrics
                else "no held-out metrics"
            )
            + ")"
        )
        return LearnedSource(
            predictor, cache, embed_options, {c.conversation_id: c for c in evaluation}
        )

    return factory
