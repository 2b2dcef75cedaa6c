"""Training end to end: samples → cached embeddings → MLP fit → held-out metrics.

`train_predictor` is the library call behind `lpc train` and the daily job: it takes
conversations (any loader's), trains on the training half only (validation inside it picks
the checkpoint) and scores the result on the evaluation half, together with the paper's
turns-only ablation. Predictions for the metrics go through `predictor.Predictor`, the same
code that serves the model, so the numbers describe what is deployed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from predictor.access_features import check_names, needs_token_counts, sample_matrix
from predictor.artifact import ArtifactMetadata, ModelArtifact
from predictor.embedders import DEFAULT_EMBEDDER_SPEC
from predictor.embedders.base import Embedder
from predictor.errors import InvalidInputError
from predictor.features import FeatureConfig, encode_turn_counts
from predictor.json_values import finite_or_none
from predictor.model import DEFAULT_HIDDEN_SIZES, MLPConfig, input_matrix
from predictor.predictor import Predictor
from training.conversation import Conversation
from training.data import SampleSplit, attach_token_counts, split_samples
from training.embedding_cache import EmbeddingCache, EmbedOptions, EmbedStats
from training.fit import FitConfig, FitResult, fit_mlp
from training.metrics import brier_prior_corrected, classification_metrics
from training.samples import (
    DEFAULT_VALIDATION_FRACTION,
    TokenCounter,
    TurnSample,
    labels_of,
    turn_counts_of,
)
from training.split import SPLIT_VERSION
from training.turns_baseline import TurnsBaseline

Log = Callable[[str], None]


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides the trained model besides the data (validated here)."""

    embedder_spec: str = DEFAULT_EMBEDDER_SPEC
    feature_config: FeatureConfig = field(default_factory=FeatureConfig)
    hidden_sizes: tuple[int, ...] = DEFAULT_HIDDEN_SIZES
    dropout: float = 0.0
    finish_features: tuple[str, ...] = ()
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION
    fit: FitConfig = field(default_factory=FitConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.embedder_spec, str) or not self.embedder_spec:
            raise InvalidInputError(
                f"TrainConfig.embedder_spec must be a non-empty string, got {self.embedder_spec!r}"
            )
        if not 0.0 < self.validation_fraction < 1.0:
            raise InvalidInputError(
                f"TrainConfig.validation_fraction must be in (0, 1), "
                f"got {self.validation_fraction!r}"
            )
        object.__setattr__(
            self,
            "finish_features",
            check_names(self.finish_features, "TrainConfig.finish_features", "sample"),
        )
        MLPConfig(hidden_sizes=self.hidden_sizes, dropout=self.dropout)  # validates both

    def mlp_config(self, embedding_dim: int) -> MLPConfig:
        return MLPConfig(embedding_dim, self.hidden_sizes, self.dropout, self.finish_features)

    def to_dict(self) -> dict[str, Any]:
        return {
            "embedder_spec": self.embedder_spec,
            "feature_config": self.feature_config.to_dict(),
            "hidden_sizes": list(self.hidden_sizes),
            "dropout": self.dropout,
            "finish_features": list(self.finish_features),
            "validation_fraction": self.validation_fraction,
            "fit": self.fit.to_dict(),
        }


@dataclass
class TrainingOutcome:
    artifact: ModelArtifact  # path None until saved
    metrics: dict[str, Any]
    fit: FitResult
    timings_s: dict[str, float]
    embed_stats: EmbedStats
    split: SampleSplit


def sample_embeddings(
    cache: EmbeddingCache,
    samples: Sequence[TurnSample],
    config: FeatureConfig,
    options: EmbedOptions,
    stats: EmbedStats | None = None,
) -> np.ndarray:
    return cache.embeddings_for([s.window for s in samples], config, options, stats)


def model_inputs(
    embeddings: np.ndarray,
    samples: Sequence[TurnSample],
    feature_config: FeatureConfig,
    finish_features: Sequence[str],
) -> np.ndarray:
    """The MLP input rows of `samples` (see `predictor.model.input_matrix`)."""
    turns = encode_turn_counts(turn_counts_of(samples), feature_config)
    extras = sample_matrix(samples, finish_features) if finish_features else None
    return input_matrix(embeddings, turns, extras)


def predict_samples(
    predictor: Predictor, embeddings: np.ndarray, samples: Sequence[TurnSample]
) -> np.ndarray:
    """Probabilities for samples whose window embeddings are given, as the server computes
    them (row by row), with the model's finish features when it has any."""
    extras = sample_matrix(samples, predictor.extra_features) if predictor.extra_features else None
    return predictor.predict_from_embeddings(embeddings, turn_counts_of(samples), extras)


def score(
    labels: np.ndarray, probabilities: np.ndarray, train_rate: float, weighted_rate: float
) -> dict[str, Any]:
    """The held-out metrics of one predictor (JSON-ready)."""
    metrics = classification_metrics(labels, probabilities).to_dict()
    metrics["brier_prior_corrected"] = round(
        brier_prior_corrected(labels, probabilities, weighted_rate, train_rate), 6
    )
    return finite_or_none(metrics)


def turns_ablation(
    evaluation: Sequence[TurnSample], conversations_turns: Sequence[int]
) -> dict[str, Any]:
    """LPC_turns on the evaluation half: majority label per turn-count bin (the paper's), and
    the bin's mean rate (what `lpc-turns` feeds the evictor)."""
    labels = labels_of(evaluation)
    counts = turn_counts_of(evaluation)
    out = {}
    for name, majority in (("majority", True), ("rate", False)):
        baseline = TurnsBaseline.fit(conversations_turns, majority=majority)
        out[name] = finite_or_none(
            classification_metrics(labels, baseline.predict_counts(counts)).to_dict()
        )
    return out


def check_both_labels(samples: Sequence[TurnSample]) -> None:
    """Refuse, before any embedding or fitting, samples that are all one label: the classifier
    and its metrics need both (sklearn would only fail at the end with "Input contains NaN")."""
    if not samples:
        raise InvalidInputError(
            "no usable samples: the training half holds no user turn (an empty dataset, or "
            "every conversation fell in the evaluation half)"
        )
    labels = {s.label for s in samples}
    if len(labels) == 1:
        (label,) = labels
        meaning = (
            "every conversation continues after each of its turns"
            if label
            else "no conversation has a second user turn"
        )
        raise InvalidInputError(
            f"all {len(samples)} training samples are label {label} ({meaning}); a "
            "continuation predictor needs both labels: use conversations with several user "
            "turns as well as ones that end"
        )


@dataclass
class _SplitEmbeddings:
    """The window embeddings of a split's samples, half by half (evaluation: None when the
    run does not evaluate or the split has no evaluation half)."""

    train: np.ndarray
    validation: np.ndarray
    evaluation: np.ndarray | None


def train_predictor(
    conversations: Sequence[Conversation],
    config: TrainConfig,
    embedder: Embedder,
    cache: EmbeddingCache,
    embed_options: EmbedOptions | None = None,
    data_description: dict[str, Any] | None = None,
    evaluate: bool = True,
    log: Log = print,
    token_counter: TokenCounter | None = None,
) -> TrainingOutcome:
    """Train on the training half of `conversations`, score on their evaluation half.

    `token_counter` counts requests in serving tokens; needed only by token finish features.
    Stages: samples → embeddings → fit → artifact metadata → held-out metrics; the time of
    each timed stage goes into the metrics (`timings_s`).
    """
    embed_options = embed_options or EmbedOptions()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    split, notes = _training_samples(conversations, config, evaluate, token_counter)
    timings["samples_s"] = time.perf_counter() - t0
    counts = split.counts()
    log(
        f"samples: {counts['train_samples']} train, {counts['validation_samples']} "
        f"validation, {counts['evaluation_samples']} evaluation "
        f"(positive rate {counts['train_positive_rate']:.3f} in train)"
    )

    stats = EmbedStats()
    t0 = time.perf_counter()
    embeddings = _embed_split(cache, split, config.feature_config, embed_options, evaluate, stats)
    timings["embed_s"] = time.perf_counter() - t0
    log(
        f"embeddings: {stats.windows_cached} of {stats.windows} windows cached, "
        f"{stats.texts_embedded} texts embedded"
        + (f" ({stats.texts_per_second:.1f} texts/s)" if stats.texts_embedded else "")
    )

    t0 = time.perf_counter()
    mlp_config = config.mlp_config(embedder.dim)
    result = _fit_split(split, embeddings, config, mlp_config)
    timings["fit_s"] = time.perf_counter() - t0
    log(
        f"fit: {result.epochs_run} epochs, best epoch {result.best_epoch + 1} "
        f"(validation loss {result.best_val_loss:.4f}), {result.seconds:.1f} s"
    )

    train_rate = float(labels_of(split.training_half).mean())
    metadata = _artifact_metadata(
        config, embedder, mlp_config, split, train_rate, data_description, notes
    )
    predictor = Predictor(ModelArtifact(None, metadata, result.model), embedder)
    weighted_rate = _weighted_rate(result.class_weights, train_rate)
    t0 = time.perf_counter()
    metrics = _held_out_metrics(
        predictor, split, embeddings, counts, result, train_rate, weighted_rate, log
    )
    timings["evaluate_s"] = time.perf_counter() - t0
    metrics["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    metrics["embedding"] = stats.to_dict()
    artifact = ModelArtifact(None, replace(metadata, metrics=metrics), result.model)
    return TrainingOutcome(artifact, metrics, result, timings, stats, split)


def _training_samples(
    conversations: Sequence[Conversation],
    config: TrainConfig,
    evaluate: bool,
    token_counter: TokenCounter | None,
) -> tuple[SampleSplit, dict[str, Any]]:
    """The split samples (refused, before any embedding, when all one label), with serving
    token counts attached when a finish feature needs them; and notes for the metadata."""
    split = split_samples(
        conversations,
        config.feature_config.window_size,
        config.validation_fraction,
        with_evaluation=evaluate,
    )
    check_both_labels(split.train + split.validation)
    notes: dict[str, Any] = {}
    if needs_token_counts(config.finish_features):
        if token_counter is None:
            raise ValueError(
                f"finish features {list(config.finish_features)} need request "
                "sizes in serving tokens: pass a token counter"
            )
        split, without = attach_token_counts(split, token_counter(conversations))
        notes["serving_tokenizer"] = token_counter.name
        notes["samples_without_token_counts"] = without
    return split, notes


def _embed_split(
    cache: EmbeddingCache,
    split: SampleSplit,
    feature_config: FeatureConfig,
    embed_options: EmbedOptions,
    evaluate: bool,
    stats: EmbedStats,
) -> _SplitEmbeddings:
    """Embed every half through the cache (the evaluation half only when evaluating)."""
    train = sample_embeddings(cache, split.train, feature_config, embed_options, stats)
    validation = sample_embeddings(cache, split.validation, feature_config, embed_options, stats)
    evaluation = (
        sample_embeddings(cache, split.evaluation, feature_config, embed_options, stats)
        if evaluate and split.evaluation
        else None
    )
    return _SplitEmbeddings(train, validation, evaluation)


def _fit_split(
    split: SampleSplit, embeddings: _SplitEmbeddings, config: TrainConfig, mlp_config: MLPConfig
) -> FitResult:
    """Fit the MLP on the training samples; the validation samples pick the checkpoint."""
    feature_config, finish = config.feature_config, config.finish_features
    return fit_mlp(
        model_inputs(embeddings.train, split.train, feature_config, finish),
        labels_of(split.train),
        model_inputs(embeddings.validation, split.validation, feature_config, finish),
        labels_of(split.validation),
        mlp_config,
        config.fit,
    )


def _artifact_metadata(
    config: TrainConfig,
    embedder: Embedder,
    mlp_config: MLPConfig,
    split: SampleSplit,
    train_rate: float,
    data_description: dict[str, Any] | None,
    notes: dict[str, Any],
) -> ArtifactMetadata:
    """What the artifact records about how it was trained (metrics are added after scoring)."""
    return ArtifactMetadata(
        embedder_id=embedder.embedder_id,
        feature_config=config.feature_config,
        mlp_config=mlp_config,
        base_rate=train_rate,
        training_data_fingerprint=split.fingerprint(),
        embedder_spec=config.embedder_spec,
        notes={
            "data": data_description or {},
            "split_version": SPLIT_VERSION,
            "train_config": config.to_dict(),
            **notes,
        },
    )


def _held_out_metrics(
    predictor: Predictor,
    split: SampleSplit,
    embeddings: _SplitEmbeddings,
    counts: dict[str, Any],
    result: FitResult,
    train_rate: float,
    weighted_rate: float,
    log: Log,
) -> dict[str, Any]:
    """The metrics: data counts, the fit's summary, scores on the validation half and, when
    evaluating, on the evaluation half with the turns-only ablation beside them. Predictions
    go through `Predictor`, the serving code (`score` corrects the Brier score for the
    weighted loss's rate)."""
    metrics: dict[str, Any] = {"data": counts, "fit": result.summary()}
    val_p = predict_samples(predictor, embeddings.validation, split.validation)
    metrics["validation"] = score(labels_of(split.validation), val_p, train_rate, weighted_rate)
    if embeddings.evaluation is not None:
        eval_p = predict_samples(predictor, embeddings.evaluation, split.evaluation)
        metrics["evaluation"] = score(
            labels_of(split.evaluation), eval_p, train_rate, weighted_rate
        )
        train_conversation_turns = _conversation_turns(split.training_half)
        metrics["turns_ablation"] = turns_ablation(split.evaluation, train_conversation_turns)
        e = metrics["evaluation"]
        log(
            f"evaluation half: MCC {e['mcc']:.4f}, macro-F1 {e['macro_f1']:.4f}, "
            f"AUC {e['roc_auc']:.4f}, Brier {e['brier']:.4f}"
        )
    return metrics


def _weighted_rate(class_weights: tuple[float, float], rate: float) -> float:
    """The positive rate the weighted loss effectively trains under."""
    w0, w1 = class_weights
    return w1 * rate / (w1 * rate + w0 * (1 - rate))


def _conversation_turns(samples: Sequence[TurnSample]) -> list[int]:
    """Each conversation's number of user turns (the largest turn count among its samples)."""
    turns: dict[str, int] = {}
    for s in samples:
        turns[s.conversation_id] = max(turns.get(s.conversation_id, 0), s.turn_count)
    return list(turns.values())


def evaluate_artifact(
    path: Path,
    samples: Sequence[TurnSample],
    cache: EmbeddingCache,
    embed_options: EmbedOptions | None = None,
    embedder: Embedder | None = None,
) -> dict[str, Any]:
    """Score a saved artifact on `samples` (through the embedding cache of its embedder)."""
    predictor = Predictor.load(path, embedder=embedder)
    embeddings = sample_embeddings(
        cache, samples, predictor.feature_config, embed_options or EmbedOptions()
    )
    probabilities = predict_samples(predictor, embeddings, samples)
    return classification_metrics(labels_of(samples), probabilities).to_dict()


def embed_both_halves(
    cache: EmbeddingCache, split: SampleSplit, features: FeatureConfig, embed: EmbedOptions
) -> EmbedStats:
    """Fill the embedding cache for the training and evaluation halves without training (on a
    GPU box, say): a later run elsewhere reads the embeddings instead of computing them."""
    stats = EmbedStats()
    for samples in (split.training_half, split.evaluation):
        sample_embeddings(cache, samples, features, embed, stats)
    return stats


@dataclass(frozen=True)
class PublishedArtifact:
    """Where a trained artifact went: a plain folder (version None) or a registry version."""

    where: Path
    version: str | None
    metadata: ArtifactMetadata


def publish_artifact(
    outcome: TrainingOutcome,
    out: Path | None,
    overwrite: bool,
    registry_dir: Path,
    promote: bool,
    source: str,
) -> PublishedArtifact:
    """Write the artifact to `out`, or publish it as the registry's next version (promoted
    when `promote`) with a history entry, all under the registry's lock."""
    from predictor.artifact import save_artifact
    from training.model_registry import ModelRegistry

    if out is not None:
        metadata = save_artifact(
            out, outcome.artifact.model, outcome.artifact.metadata, overwrite=overwrite
        )
        return PublishedArtifact(out, None, metadata)
    registry = ModelRegistry(registry_dir)
    with registry.lock():
        version = registry.publish(
            outcome.artifact.model, outcome.artifact.metadata, {"source": source}
        )
        if promote:
            registry.promote(version)
        registry.append_history(
            {
                "event": "train",
                "version": version,
                "promoted": promote,
                "metrics": outcome.metrics.get("evaluation"),
            }
        )
    return PublishedArtifact(registry.root / version, version, outcome.artifact.metadata)
