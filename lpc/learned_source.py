"""The learned probability source of the A/B harness: a trained predictor over cached embeddings.

For each replayed turn it builds the predictor's window (the turn's user prompt and up to N
before it, its turn count), embeds it through the embedding cache that training filled (the
evaluation half's turns are usually there already; missing ones are embedded once, with a
progress bar, and kept), and runs the MLP in batches — the same `Predictor` code the RPC
server runs, so the A/B measures what would be deployed.

A model trained with finish-time features (`training.finish_features`) also needs each turn's
reply and conversation size: they come from the evaluation conversations the harness loaded
(looked up by conversation id and turn index). Without them (a `--trace` replay) such a model
cannot be used, and the source says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lpc.workload import ScriptedTurn
from predictor.predictor import Predictor
from training.conversation import Conversation
from training.embedding_cache import EmbeddingCache, EmbedOptions, EmbedStats
from training.finish_features import finish_feature_matrix
from training.samples import TurnSample, conversation_samples

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

    def _sample(self, turn: ScriptedTurn) -> TurnSample:
        conversation_id = turn.conversation_id
        if conversation_id not in self._samples:
            conversation = self.conversations.get(conversation_id)
            if conversation is None:
                raise ValueError(
                    f"the model needs finish-time features {list(self.predictor.extra_features)}"
                    f" but conversation {conversation_id!r} is not among the loaded ones (a "
                    "trace replay has no replies to compute them from)")
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
            embeddings = self.cache.embeddings_for(self._windows(batch), config,
                                                   self.embed_options, self.stats)
            extras = None
            if self.predictor.extra_features:
                extras = finish_feature_matrix([self._sample(t) for t in batch],
                                               self.predictor.extra_features)
            out[start : start + len(batch)] = self.predictor.predict_from_embeddings(
                embeddings, [t.turn_index + 1 for t in batch], extras)
        return [float(p) for p in out]


def learned_source_factory(model: Path, cache_dir: Path, embed_options: EmbedOptions,
                           device: str | None = None, log=print):
    """A `ModelSourceFactory` for `lpc.ab_pipeline.run_ab`: loads the predictor (and its
    embedder) when the harness needs it, with the evaluation conversations for lookups."""

    def factory(context) -> LearnedSource:
        predictor = Predictor.load(model, device=device)
        metadata = predictor.artifact.metadata
        cache = EmbeddingCache.open(cache_dir, predictor.embedder_id, predictor.embedder.dim,
                                    embedder=predictor.embedder)
        evaluation = getattr(context, "eval_conversations", None) or []
        log(f"model: {model} ({metadata.embedder_id}; "
            + (f"evaluation MCC {metadata.metrics['evaluation']['mcc']:.3f}, "
               f"AUC {metadata.metrics['evaluation']['roc_auc']:.3f}"
               if "evaluation" in metadata.metrics else "no held-out metrics") + ")")
        return LearnedSource(predictor, cache, embed_options,
                             {c.conversation_id: c for c in evaluation})

    return factory
