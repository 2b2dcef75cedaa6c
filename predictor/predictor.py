"""`Predictor`: windows in, continuation probabilities out (artifact + embedder).

The MLP is evaluated one row at a time on a fixed buffer, in numpy. Torch's batched matmul
picks different kernels for different batch sizes, so the same row could get a probability
that differs in the last bits depending on what else was in its batch; row by row, the result
depends on the row alone, so the RPC server (which batches requests from many callers) answers
exactly what an in-process call on the cached embedding answers. The MLP is tiny: ~20 µs a row.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from predictor.access_features import (
    check_servable,
    not_computable,
    window_fields,
    window_matrix,
)
from predictor.artifact import (
    ArtifactIncompatibleError,
    DimensionMismatchError,
    EmbedderMismatchError,
    ModelArtifact,
    check_declared_features,
    load_artifact,
)
from predictor.embedders.base import Embedder
from predictor.features import (
    ConversationWindow,
    FeatureConfig,
    WindowTextBuilder,
    encode_turn_counts,
)
from predictor.model import ContinuationMLP, input_matrix
from predictor.prompt_cache import PromptEmbeddingCache


class RowwiseMLP:
    """The MLP's weights as float32 numpy arrays, evaluated row by row (see module doc)."""

    def __init__(self, model: ContinuationMLP) -> None:
        import torch

        linears = [m for m in model.layers if isinstance(m, torch.nn.Linear)]
        self.weights = [
            np.ascontiguousarray(m.weight.detach().cpu().numpy().T, np.float32) for m in linears
        ]
        self.biases = [m.bias.detach().cpu().numpy().astype(np.float32) for m in linears]
        self.input_dim = self.weights[0].shape[0]
        # Fixed buffers: same shapes and addresses on every row, so the same kernels run.
        self._row = np.zeros((1, self.input_dim), dtype=np.float32)
        self._hidden = [np.zeros((1, w.shape[1]), dtype=np.float32) for w in self.weights]
        self._lock = threading.Lock()  # the buffers are shared state

    def logits(self, inputs: np.ndarray) -> np.ndarray:
        inputs = np.asarray(inputs, dtype=np.float32)
        if inputs.ndim != 2 or inputs.shape[1] != self.input_dim:
            raise ValueError(f"expected inputs of shape (n, {self.input_dim}), got {inputs.shape}")
        out = np.empty(inputs.shape[0], dtype=np.float32)
        with self._lock:
            self._fill(inputs, out)
        return out

    def _fill(self, inputs: np.ndarray, out: np.ndarray) -> None:
        last = len(self.weights) - 1
        for i in range(inputs.shape[0]):
            self._row[0] = inputs[i]
            hidden = self._row
            for layer, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
                result = self._hidden[layer]
                np.matmul(hidden, weight, out=result)
                result += bias
                if layer < last:
                    np.maximum(result, 0.0, out=result)
                hidden = result
            out[i] = hidden[0, 0]


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function, float64."""
    x = np.asarray(logits, dtype=np.float64)
    out = np.empty_like(x)
    positive = x >= 0
    out[positive] = 1.0 / (1.0 + np.exp(-x[positive]))
    exp_x = np.exp(x[~positive])
    out[~positive] = exp_x / (1.0 + exp_x)
    return out


def _check_text_model(artifact: ModelArtifact) -> None:
    """This predictor serves text-window models only; access features come from an engine's
    request state (`predictor.access_predictor.AccessPredictor`)."""
    inputs = artifact.metadata.inputs
    if not inputs.text_window or inputs.access_features:
        raise ArtifactIncompatibleError(
            f"artifact {artifact.path} reads access features {list(inputs.access_names)}: "
            "load it with predictor.access_predictor.AccessPredictor (lpc ab --trace, "
            "lpc bench access), not as a text-window predictor"
        )
    check_declared_features(artifact.metadata, artifact.path)


class Predictor:
    """Continuation probability for conversation windows.

    `embed_batch_size` (texts per forward pass) defaults to 8: on the 2-CPU development
    machine batches of 4–8 ShareGPT windows embedded at 7.9–9.1 texts/s, batches of 32 at 5.8
    (longer padded rows, worse cache use); a GPU wants larger batches.

    `predict` builds each window's text (features.py), embeds the batch in one call, appends
    the encoded turn count (and, for a model trained with finish features a request carries,
    those features, computed from the window by the feature registry:
    `predictor.access_features`) and runs the MLP. `predict_from_embeddings`
    skips the first two steps for callers that cached embeddings (training, the A/B harness).
    """

    def __init__(
        self,
        artifact: ModelArtifact,
        embedder: Embedder,
        embed_batch_size: int = 8,
        prompt_cache_entries: int = 20_000,
    ) -> None:
        metadata = artifact.metadata
        _check_text_model(artifact)
        if metadata.embedder_id != embedder.embedder_id:
            raise EmbedderMismatchError(
                f"artifact {artifact.path} was trained on embedder {metadata.embedder_id!r}, "
                f"this embedder is {embedder.embedder_id!r}"
            )
        if metadata.embedding_dim != embedder.dim:
            raise DimensionMismatchError(
                f"artifact {artifact.path} expects {metadata.embedding_dim}-dim embeddings, "
                f"the embedder gives {embedder.dim}"
            )
        if embed_batch_size <= 0:
            raise ValueError(f"embed_batch_size must be positive, got {embed_batch_size}")
        self.artifact = artifact
        self.embedder = embedder
        self.embed_batch_size = embed_batch_size
        self._mlp = RowwiseMLP(artifact.model)
        self._texts = WindowTextBuilder(
            metadata.feature_config, embedder.tokenizer, embedder.max_input_tokens
        )
        # Only the prompt_mean encoding can reuse a prompt's vector across turns.
        self.prompt_cache = (
            PromptEmbeddingCache(prompt_cache_entries)
            if metadata.feature_config.window_encoding == "prompt_mean"
            else None
        )

    @classmethod
    def load(
        cls,
        path: Path | str,
        embedder: Embedder | None = None,
        device: str | None = None,
        embed_batch_size: int = 8,
    ) -> Predictor:
        """Load the artifact at `path`; without `embedder`, load the one its metadata names."""
        if embedder is None:
            from predictor.embedders import load_embedder

            artifact = load_artifact(path)
            _check_text_model(artifact)
            embedder = load_embedder(artifact.metadata.embedder_spec, device=device)
        else:
            artifact = load_artifact(
                path, expected_embedder_id=embedder.embedder_id, expected_embedding_dim=embedder.dim
            )
        return cls(artifact, embedder, embed_batch_size)

    @property
    def base_rate(self) -> float:
        """Positive rate of the training data: the natural fallback probability."""
        return float(self.artifact.metadata.base_rate)

    @property
    def feature_config(self) -> FeatureConfig:
        return self.artifact.metadata.feature_config

    @property
    def embedder_id(self) -> str:
        return self.embedder.embedder_id

    def window_texts(self, windows: Sequence[ConversationWindow]) -> list[str]:
        """The embedder input text of each window (without the embedder's prefix); in
        `prompt_mean` mode, the texts of the window's prompts joined by newlines (for
        inspection: each is embedded alone)."""
        if self.prompt_cache is None:
            return self._texts.build(windows)
        size = self.feature_config.window_size
        return ["\n".join(self._texts.prompt_texts(w.user_prompts[-size:])) for w in windows]

    def embed_windows(self, windows: Sequence[ConversationWindow]) -> np.ndarray:
        if self.prompt_cache is None:
            return self.embedder.embed(self._texts.build(windows), batch_size=self.embed_batch_size)
        return self._embed_prompt_means(windows)

    def _embed_prompt_means(self, windows: Sequence[ConversationWindow]) -> np.ndarray:
        assert self.prompt_cache is not None
        size = self.feature_config.window_size
        recent = [w.user_prompts[-size:] for w in windows]
        vectors: dict[str, np.ndarray] = {}
        missing = []
        for prompt in dict.fromkeys(p for prompts in recent for p in prompts):
            cached = self.prompt_cache.get(prompt)
            if cached is None:
                missing.append(prompt)
            else:
                vectors[prompt] = cached
        if missing:
            fresh = self.embedder.embed(
                self._texts.prompt_texts(missing), batch_size=self.embed_batch_size
            )
            for prompt, vector in zip(missing, fresh, strict=True):
                vectors[prompt] = vector
                self.prompt_cache.put(prompt, vector)
        out = np.empty((len(windows), self.embedder.dim), dtype=np.float32)
        for i, prompts in enumerate(recent):
            mean = np.mean([vectors[p] for p in prompts], axis=0)
            out[i] = mean / max(float(np.linalg.norm(mean)), 1e-12)
        return out

    @property
    def extra_features(self) -> tuple[str, ...]:
        """Registered features the model reads besides the window (none for the paper's)."""
        return self.artifact.metadata.mlp_config.extra_features

    @property
    def unservable_features(self) -> tuple[str, ...]:
        """The model's finish features that windows cannot supply (`predict` refuses them)."""
        return not_computable(self.extra_features, "window")

    @property
    def needs_prompt_tokens(self) -> bool:
        """Whether `predict` needs each window's `prompt_tokens`."""
        return "prompt_tokens" in window_fields(self.extra_features)

    def check_servable(self) -> None:
        """Raise `UnservableFeaturesError` (a ValueError naming the features) unless `predict`
        can compute every finish feature of the model from windows; the server calls it before
        serving a model, so a model it cannot serve is refused at start, not per request."""
        check_servable(self.extra_features, f"artifact {self.artifact.path}")

    def predict(self, windows: Sequence[ConversationWindow]) -> np.ndarray:
        """float64 probabilities, one per window, in order.

        A model with finish features gets them from the windows (`prompt_tokens`, the current
        prompt) through the formulas training used; one needing features only known once a
        request has finished raises `UnservableFeaturesError` (use `predict_from_embeddings`
        with the features computed), and a window lacking `prompt_tokens` its model needs
        raises `MissingPromptTokensError` — both before anything is embedded."""
        extras = None
        if self.extra_features:
            self.check_servable()
            extras = window_matrix(windows, self.extra_features)
        if len(windows) == 0:
            return np.zeros(0, dtype=np.float64)
        embeddings = self.embed_windows(windows)
        return self.predict_from_embeddings(embeddings, [w.turn_count for w in windows], extras)

    def predict_from_embeddings(
        self,
        embeddings: np.ndarray,
        turn_counts: Sequence[int] | np.ndarray,
        extras: np.ndarray | None = None,
    ) -> np.ndarray:
        """float64 probabilities for precomputed window embeddings and their turn counts
        (and, for a model trained with them, its `extra_features` columns, shape (n, k))."""
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if embeddings.ndim != 2 or embeddings.shape[1] != self.artifact.metadata.embedding_dim:
            raise ValueError(
                f"embeddings must have shape (n, "
                f"{self.artifact.metadata.embedding_dim}), got {embeddings.shape}"
            )
        turns = encode_turn_counts(turn_counts, self.feature_config)
        if turns.shape[0] != embeddings.shape[0]:
            raise ValueError(f"{embeddings.shape[0]} embeddings but {turns.shape[0]} turn counts")
        needed = len(self.extra_features)
        if needed and (extras is None or np.shape(extras) != (embeddings.shape[0], needed)):
            raise ValueError(
                f"this model needs extra features {list(self.extra_features)}: "
                f"an array of shape ({embeddings.shape[0]}, {needed}), got "
                f"{None if extras is None else np.shape(extras)}"
            )
        if not needed and extras is not None:
            raise ValueError("this model takes no extra features")
        inputs = input_matrix(embeddings, turns, extras)
        return sigmoid(self._mlp.logits(inputs))
