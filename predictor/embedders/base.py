"""The contract every embedder meets, and a tokenizer adapter shared by the implementations.

Features are counted in the embedder's own tokenizer (the paper's rule; docs/predictor.md
"Features"), so an embedder
exposes its tokenizer through `EmbedderTokenizer`: token character spans (to cut a prompt at
token boundaries) and the number of tokens the model is actually fed (prefix and special
tokens included), so a window's text can be held to the token budget exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

QUERY_PREFIX = "query: "


@runtime_checkable
class EmbedderTokenizer(Protocol):
    def token_spans(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Per text, the (start, end) character span of each content token of the text alone."""
        ...

    def count_input_tokens(self, texts: Sequence[str]) -> list[int]:
        """Per text, the tokens the model is fed for it: prefix and special tokens included."""
        ...


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to L2-normalised float32 vectors; `embed` applies the prefix convention."""

    embedder_id: str  # names the embedding function: weights + prefix convention
    dim: int
    max_input_tokens: int  # longest input (prefix and special tokens included) it embeds whole

    @property
    def tokenizer(self) -> EmbedderTokenizer: ...

    def embed(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """float32 array of shape (len(texts), dim)."""
        ...


def prefix_label(prefix: str) -> str:
    """The part of an embedder id that names its prefix convention."""
    if prefix == QUERY_PREFIX:
        return "query-prefix"
    if prefix == "":
        return "no-prefix"
    return f"prefix={prefix!r}"


class FastTokenizerAdapter:
    """`EmbedderTokenizer` over a Hugging Face `tokenizers.Tokenizer`.

    Counting must see the whole text, even where the model itself would truncate, so a
    tokenizer configured to truncate or pad is copied with both switched off. One without
    either is shared as is: a copy of e5's 250k-piece tokenizer costs ~280 MB.
    """

    def __init__(self, tokenizer, prefix: str) -> None:
        if tokenizer.truncation is not None or tokenizer.padding is not None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(tokenizer.to_str())
            tokenizer.no_truncation()
            tokenizer.no_padding()
        self._tokenizer = tokenizer
        self.prefix = prefix

    def token_spans(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [list(encoding.offsets) for encoding in encodings]

    def count_input_tokens(self, texts: Sequence[str]) -> list[int]:
        encodings = self._tokenizer.encode_batch([self.prefix + t for t in texts])
        return [len(encoding.ids) for encoding in encodings]

    def encode_ids(self, text: str, with_prefix: bool = True) -> list[int]:
        """Token ids the model is fed for `text` (for parity checks and debugging)."""
        return self._tokenizer.encode(self.prefix + text if with_prefix else text).ids
