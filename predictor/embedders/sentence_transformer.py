"""Embedder over any sentence-transformers model: a hub id or a local folder.

This is the engine for the paper's multilingual-e5-small (hub id, or the offline dequantised
import), and for any other sentence-transformers model used in ablations or tests. Models of
the common shape (Transformer → mean/CLS/max Pooling → optional Normalize) run on
`transformers` directly (`st_folder.py` says why); anything else goes through the
sentence-transformers library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from predictor.embedders.base import QUERY_PREFIX, FastTokenizerAdapter, prefix_label
from predictor.embedders.st_folder import FolderSpec, read_folder_spec

E5_IMPORT_MARKER = "lpc_import.json"
_GENERIC_FOLDER_NAMES = frozenset({"model", "models", "checkpoint", "0_Transformer", "final"})
_E5_NAME = re.compile(r"(^|[^a-z0-9])e5([^a-z0-9]|$)")


def _weights_id(model_id_or_path: str, folder: Path) -> str:
    """A machine-independent name for the weights: the import's declared id, the folder name
    for other local folders, the hub id otherwise."""
    if Path(model_id_or_path).expanduser().is_dir():
        marker = folder / E5_IMPORT_MARKER
        if marker.is_file():
            declared = json.loads(marker.read_text(encoding="utf-8")).get("weights_id")
            if declared:
                return str(declared)
        resolved = folder.resolve()
        if resolved.name in _GENERIC_FOLDER_NAMES:
            return f"{resolved.parent.name}/{resolved.name}"
        return resolved.name
    return model_id_or_path


def _default_prefix(prompts: dict[str, str], model_id_or_path: str) -> str:
    """The model's own "query" prompt if it declares one; "query: " for e5 models; else none."""
    if prompts.get("query"):
        return prompts["query"]
    if _E5_NAME.search(str(model_id_or_path).lower()):
        return QUERY_PREFIX
    return ""


def _resolve_folder(model_id_or_path: str) -> Path:
    path = Path(model_id_or_path).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id=model_id_or_path))


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class _TransformersEncoder:
    """Tokenise, run the transformer, pool, normalise: what sentence-transformers does for
    this shape, on right-padded batches."""

    def __init__(self, spec: FolderSpec, device: str, max_seq_length: int | None) -> None:
        import torch
        from tokenizers import Tokenizer
        from transformers import AutoModel

        self.spec = spec
        self.device = device
        self.model = AutoModel.from_pretrained(str(spec.transformer_path)).to(device).eval()
        tokenizer_file = spec.transformer_path / "tokenizer.json"
        if tokenizer_file.is_file():
            tokenizer = Tokenizer.from_file(str(tokenizer_file))
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(spec.transformer_path)).backend_tokenizer
        # One tokenizer object serves counting and encoding: a large vocabulary (e5's 250k
        # pieces) costs ~280 MB per copy. Truncation is therefore done here, not configured.
        padding = tokenizer.padding
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.counting_tokenizer = tokenizer
        config = self.model.config
        limit = max_seq_length or spec.max_seq_length or config.max_position_embeddings
        self.max_seq_length = int(min(limit, config.max_position_embeddings))
        self.content_limit = self.max_seq_length - tokenizer.num_special_tokens_to_add(False)
        pad_id = padding["pad_id"] if padding else getattr(config, "pad_token_id", None)
        self.pad_id = int(pad_id) if pad_id is not None else 0
        self._torch = torch

    def encode(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        if self.spec.do_lower_case:
            texts = [t.lower() for t in texts]
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        for encoding in encodings:
            if len(encoding.ids) > self.content_limit:
                encoding.truncate(self.content_limit)
        encodings = [self.tokenizer.post_process(e) for e in encodings]
        length = max(len(e.ids) for e in encodings)
        ids = np.full((len(texts), length), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(texts), length), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        input_ids = torch.from_numpy(ids).to(self.device)
        attention = torch.from_numpy(mask).to(self.device)
        with torch.inference_mode():
            tokens = self.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
            if self.spec.pooling_mode == "cls":
                pooled = tokens[:, 0]
            elif self.spec.pooling_mode == "max":
                masked = tokens.masked_fill(attention.unsqueeze(-1) == 0, float("-inf"))
                pooled = masked.max(dim=1).values
            else:
                weights = attention.unsqueeze(-1).to(tokens.dtype)
                pooled = (tokens * weights).sum(1) / torch.clamp(weights.sum(1), min=1e-9)
            if self.spec.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().numpy()


class _LibraryEncoder:
    """The sentence-transformers library, for model shapes `_TransformersEncoder` lacks."""

    def __init__(self, folder: Path, device: str, max_seq_length: int | None, prefix: str) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(folder), device=device)
        self.model.eval()
        if max_seq_length is not None:
            self.model.max_seq_length = max_seq_length
        self.max_seq_length = int(self.model.max_seq_length)
        self.counting_tokenizer = self.model.tokenizer.backend_tokenizer
        self.prefix = prefix
        self.device = device

    def encode(self, texts: list[str]) -> np.ndarray:
        # `texts` already carry the prefix (the embedder adds it for both engines).
        vectors = self.model.encode(
            texts, batch_size=len(texts), convert_to_numpy=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)


class SentenceTransformerEmbedder:
    """Runs a sentence-transformers model with torch; on a GPU when one is available.

    `prefix` defaults to the model's declared "query" prompt, else "query: " for e5 models
    (the e5 convention: a prompt whose continuation we predict is a query), else none. The
    prefix is part of `embedder_id`, since the same weights with another prefix embed
    differently (~0.96 cosine for e5's "passage: "). Texts are grouped by length into
    forward passes of at most `batch_size` texts and `max_batch_tokens` padded tokens, so
    activation memory stays bounded when many long windows arrive together.
    """

    def __init__(
        self,
        model_id_or_path: str | Path,
        device: str | None = None,
        prefix: str | None = None,
        max_seq_length: int | None = None,
        max_batch_tokens: int = 4096,
        use_library: bool = False,
    ) -> None:
        if max_seq_length is not None and max_seq_length <= 0:
            raise ValueError(f"max_seq_length must be positive, got {max_seq_length}")
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        name = str(model_id_or_path)
        folder = _resolve_folder(name)
        device = device or _default_device()
        spec = None if use_library else read_folder_spec(folder)
        prompts = (
            spec.prompts
            if spec
            else json.loads(
                (folder / "config_sentence_transformers.json").read_text(encoding="utf-8")
            ).get("prompts", {})
            if (folder / "config_sentence_transformers.json").is_file()
            else {}
        )
        self.prefix = _default_prefix(prompts or {}, name) if prefix is None else prefix
        if spec is not None:
            self.engine: _TransformersEncoder | _LibraryEncoder = _TransformersEncoder(
                spec, device, max_seq_length
            )
        else:
            self.engine = _LibraryEncoder(folder, device, max_seq_length, self.prefix)
        self.max_batch_tokens = max_batch_tokens
        self.max_input_tokens = self.engine.max_seq_length
        self._folder = folder
        self._library_model = None
        self.embedder_id = f"{_weights_id(name, folder)}+{prefix_label(self.prefix)}"
        self._tokenizer = FastTokenizerAdapter(self.engine.counting_tokenizer, self.prefix)
        probe = self.engine.encode([self.prefix + "dimension probe"])
        self.dim = int(probe.shape[1])

    @property
    def tokenizer(self) -> FastTokenizerAdapter:
        return self._tokenizer

    @property
    def device(self) -> str:
        return str(self.engine.device)

    @property
    def uses_library(self) -> bool:
        return isinstance(self.engine, _LibraryEncoder)

    def library_model(self):
        """These weights as a sentence-transformers `SentenceTransformer`, for what only the
        library offers (its multi-process pool, which spreads embedding over devices). The
        engine's own model when it is the library; else loaded once, on the CPU, with the
        same maximum input length (the pool moves it to each worker's device)."""
        if isinstance(self.engine, _LibraryEncoder):
            return self.engine.model
        if self._library_model is None:
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(str(self._folder), device="cpu")
            model.eval()
            model.max_seq_length = self.max_input_tokens
            self._library_model = model
        return self._library_model

    def embed(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if len(texts) == 0:
            return out
        lengths = [
            min(n, self.max_input_tokens) for n in self._tokenizer.count_input_tokens(list(texts))
        ]
        for group in length_groups(lengths, batch_size, self.max_batch_tokens):
            out[group] = self.engine.encode([self.prefix + texts[i] for i in group])
        return out


def length_groups(lengths: Sequence[int], max_texts: int, max_tokens: int) -> list[list[int]]:
    """Indices grouped longest first into batches of <= max_texts texts whose padded size
    (texts × longest) stays <= max_tokens (a single text may exceed it alone)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for index in order:
        if groups:
            group = groups[-1]
            longest = lengths[group[0]]
            if len(group) < max_texts and (len(group) + 1) * longest <= max_tokens:
                group.append(index)
                continue
        groups.append([index])
    return groups
