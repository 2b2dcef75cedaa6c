"""An on-disk cache of tokenised conversations, so a replay does not re-tokenise every run.

One file per (tokenizer name + fingerprint, template version, max_model_len, data
fingerprint, cache format) under `<cache dir>/tokens/`, written to a temporary file and renamed
into place (a crash never leaves half a file under the final name). The data fingerprint
hashes the conversations themselves (ids, split keys, roles, text), so any change to the data
or to the loaders' cleaning gives a new key. A file that cannot be read is rebuilt.

The cache directory is `$LPC_CACHE_DIR` when set, else `.cache/lpc/` in the repository
(git-ignored), else `~/.cache/lpc` when the code is not running from a checkout.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from lpc.chat.tokenization import (
    DEFAULT_MAX_MODEL_LEN,
    TEMPLATE_VERSION,
    ConversationTokens,
    TokenizationReport,
    TokenizedConversations,
    TurnTokens,
    check_max_model_len,
    tokenize_conversations,
)
from lpc.chat.tokenizers import ChatTokenizer, default_chat_tokenizer
from predictor.atomic_files import atomic_open
from training.conversation import Conversation

CACHE_DIR_ENV = "LPC_CACHE_DIR"
CACHE_FORMAT_VERSION = 1
_REPO_ROOT = Path(__file__).resolve().parents[2]


def default_cache_dir() -> Path:
    """`$LPC_CACHE_DIR`, else the repository's `.cache/lpc`, else `~/.cache/lpc`."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured)
    if (_REPO_ROOT / "pyproject.toml").is_file():
        return _REPO_ROOT / ".cache" / "lpc"
    return Path.home() / ".cache" / "lpc"


def conversations_fingerprint(conversations: Sequence[Conversation]) -> str:
    """A hash of everything tokenisation reads from the conversations, in order."""
    digest = hashlib.sha256()
    for conversation in conversations:
        digest.update(_field(conversation.conversation_id))
        digest.update(_field(conversation.split_key))
        digest.update(len(conversation.messages).to_bytes(4, "little"))
        for message in conversation.messages:
            digest.update(_field(message.role))
            digest.update(_field(message.content))
    return digest.hexdigest()


def _field(text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return len(data).to_bytes(8, "little") + data


def cache_key(tokenizer: ChatTokenizer, max_model_len: int, data_fingerprint: str) -> dict:
    return {
        "cache_format": CACHE_FORMAT_VERSION,
        "tokenizer": tokenizer.name,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "template": TEMPLATE_VERSION,
        "max_model_len": max_model_len,
        "data": data_fingerprint,
    }


def cache_path(cache_dir: Path, key: dict) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir / "tokens" / f"{name}.npz"


def tokenize_conversations_cached(
    conversations: Sequence[Conversation],
    tokenizer: ChatTokenizer | None = None,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    cache_dir: str | Path | None = None,
    progress: bool = True,
) -> TokenizedConversations:
    """`tokenize_conversations`, read from the cache when this exact work was done before.

    The result says `from_cache`; its token ids are read-only views of one array per file.
    """
    check_max_model_len(max_model_len)
    tokenizer = tokenizer if tokenizer is not None else default_chat_tokenizer()
    key = cache_key(tokenizer, max_model_len, conversations_fingerprint(conversations))
    path = cache_path(Path(cache_dir) if cache_dir is not None else default_cache_dir(), key)
    if path.is_file():
        cached = read_tokenized(path, key)
        if cached is not None:
            return cached
    result = tokenize_conversations(conversations, tokenizer, max_model_len, progress)
    write_tokenized(path, key, result)
    return result


def write_tokenized(path: Path, key: dict, result: TokenizedConversations) -> None:
    """Write atomically: a temporary file in the same folder, then a rename."""
    conversations = result.conversations
    turns = [turn for conversation in conversations for turn in conversation.turns]
    offsets = np.zeros(len(conversations) + 1, dtype=np.int64)
    np.cumsum([len(c.token_ids) for c in conversations], out=offsets[1:])
    tokens = np.empty(int(offsets[-1]), dtype=np.uint32)
    for conversation, start in zip(conversations, offsets[:-1], strict=False):
        tokens[start : start + len(conversation.token_ids)] = np.frombuffer(
            conversation.token_ids, dtype=np.uint32
        )
    arrays = {
        "key": _json_bytes(key),
        "ids": _json_bytes([[c.conversation_id, c.split_key] for c in conversations]),
        "report": _json_bytes(asdict(result.report)),
        "tokens": tokens,
        "offsets": offsets,
        "num_user_turns": np.array([c.num_user_turns for c in conversations], dtype=np.int64),
        "num_turns": np.array([len(c.turns) for c in conversations], dtype=np.int64),
        "num_prompt_tokens": np.array([t.num_prompt_tokens for t in turns], dtype=np.int64),
        "num_output_tokens": np.array([t.num_output_tokens for t in turns], dtype=np.int64),
        "has_reply": np.array([t.has_reply for t in turns], dtype=np.bool_),
    }
    with atomic_open(path, "wb") as f:
        np.savez(f, **arrays)


def read_tokenized(path: Path, key: dict) -> TokenizedConversations | None:
    """The cached result, or None when the file is unreadable or was made for another key."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if _from_json_bytes(data["key"]) != key:
                return None
            ids = _from_json_bytes(data["ids"])
            report = TokenizationReport(**_from_json_bytes(data["report"]))
            tokens = data["tokens"]
            offsets = data["offsets"]
            num_user_turns = data["num_user_turns"].tolist()
            num_turns = data["num_turns"].tolist()
            num_prompt = data["num_prompt_tokens"].tolist()
            num_output = data["num_output_tokens"].tolist()
            has_reply = data["has_reply"].tolist()
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return None
    if tokens.dtype != np.uint32 or len(offsets) != len(ids) + 1:
        return None
    view = memoryview(tokens).toreadonly()
    conversations: list[ConversationTokens] = []
    t = 0
    for i, (conversation_id, split_key) in enumerate(ids):
        sequence = view[int(offsets[i]) : int(offsets[i + 1])]
        kept = num_turns[i]
        turns = tuple(
            TurnTokens(
                conversation_id,
                split_key,
                k,
                num_prompt[t + k],
                num_output[t + k],
                kept,
                k < kept - 1,
                has_reply[t + k],
                sequence,
            )
            for k in range(kept)
        )
        t += kept
        conversations.append(
            ConversationTokens(conversation_id, split_key, sequence, turns, num_user_turns[i])
        )
    return TokenizedConversations(conversations, report, from_cache=True)


def _json_bytes(value: object) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), dtype=np.uint8)


def _from_json_bytes(array: np.ndarray) -> object:
    return json.loads(array.tobytes().decode())
