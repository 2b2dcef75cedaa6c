"""The on-disk cache of tokenised conversations."""

import numpy as np

from lpc.chat import token_cache
from lpc.chat.token_cache import (
    CACHE_DIR_ENV,
    conversations_fingerprint,
    default_cache_dir,
    tokenize_conversations_cached,
)
from lpc.chat.tokenization import tokenize_conversations
from training.conversation import Conversation, Message


class CharTokenizer:
    name = "chars"
    fingerprint = "chars-v1"
    im_start_id = 1
    im_end_id = 2

    def __init__(self):
        self.calls = 0

    def encode(self, text):
        self.calls += 1
        return [ord(c) + 10 for c in text]


CONVERSATIONS = [
    Conversation(
        "a",
        (
            Message("user", "Hi"),
            Message("assistant", "Hello"),
            Message("user", "More?"),
        ),
        "test",
    ),
    Conversation("b", (Message("user", "x" * 300),), "test"),  # dropped by the cut below
    Conversation("c_1", (Message("user", "Q"), Message("assistant", "A")), "test", "c"),
]


def as_plain(result):
    return [
        (
            c.conversation_id,
            c.split_key,
            c.token_ids.tolist(),
            c.num_user_turns,
            [
                (t.turn_index, t.num_prompt_tokens, t.num_output_tokens, t.has_reply)
                for t in c.turns
            ],
        )
        for c in result.conversations
    ]


def test_second_call_reads_the_cache(tmp_path):
    first_tokenizer = CharTokenizer()
    first = tokenize_conversations_cached(
        CONVERSATIONS, first_tokenizer, 200, tmp_path, progress=False
    )
    assert not first.from_cache and first_tokenizer.calls > 0
    files = list((tmp_path / "tokens").iterdir())
    assert len(files) == 1 and files[0].suffix == ".npz"  # no temporary file left behind
    second_tokenizer = CharTokenizer()
    second = tokenize_conversations_cached(
        CONVERSATIONS, second_tokenizer, 200, tmp_path, progress=False
    )
    assert second.from_cache and second_tokenizer.calls == 0
    assert as_plain(second) == as_plain(first)
    assert second.report == first.report
    assert second.turns == first.turns
    assert [t.has_next_turn for t in second.turns] == [True, False, False]
    assert second.conversations[0].token_ids.readonly


def test_key_changes_with_max_model_len_and_data(tmp_path):
    tokenize_conversations_cached(CONVERSATIONS, CharTokenizer(), 200, tmp_path, progress=False)
    tokenize_conversations_cached(CONVERSATIONS, CharTokenizer(), 500, tmp_path, progress=False)
    edited = [*CONVERSATIONS[:2], Conversation("c_1", (Message("user", "Q!"),), "test", "c")]
    tokenize_conversations_cached(edited, CharTokenizer(), 200, tmp_path, progress=False)
    assert len(list((tmp_path / "tokens").iterdir())) == 3


def test_fingerprint_covers_ids_split_keys_roles_and_text():
    base = conversations_fingerprint(CONVERSATIONS)
    assert base == conversations_fingerprint(list(CONVERSATIONS))
    regrouped = [*CONVERSATIONS[:2], Conversation("c_1", CONVERSATIONS[2].messages, "test")]
    assert conversations_fingerprint(regrouped) != base
    retitled = [Conversation("z", CONVERSATIONS[0].messages, "test"), *CONVERSATIONS[1:]]
    assert conversations_fingerprint(retitled) != base
    # field boundaries are encoded: moving text between fields changes the hash
    one = [Conversation("ab", (Message("user", "c"),))]
    two = [Conversation("a", (Message("user", "bc"),))]
    assert conversations_fingerprint(one) != conversations_fingerprint(two)


def test_a_corrupt_file_is_rebuilt(tmp_path):
    tokenize_conversations_cached(CONVERSATIONS, CharTokenizer(), 200, tmp_path, progress=False)
    (path,) = (tmp_path / "tokens").iterdir()
    path.write_bytes(path.read_bytes()[:100])
    tokenizer = CharTokenizer()
    rebuilt = tokenize_conversations_cached(CONVERSATIONS, tokenizer, 200, tmp_path, progress=False)
    assert not rebuilt.from_cache and tokenizer.calls > 0
    reread = tokenize_conversations_cached(
        CONVERSATIONS, CharTokenizer(), 200, tmp_path, progress=False
    )
    assert reread.from_cache
    expected = tokenize_conversations(CONVERSATIONS, CharTokenizer(), 200, progress=False)
    assert as_plain(reread) == as_plain(expected)


def test_a_file_written_for_another_key_is_not_trusted(tmp_path):
    tokenize_conversations_cached(CONVERSATIONS, CharTokenizer(), 200, tmp_path, progress=False)
    (path,) = (tmp_path / "tokens").iterdir()
    with np.load(path) as data:
        arrays = dict(data)
    arrays["key"] = np.frombuffer(b'{"other": 1}', dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    again = tokenize_conversations_cached(
        CONVERSATIONS, CharTokenizer(), 200, tmp_path, progress=False
    )
    assert not again.from_cache


def test_cache_dir_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "elsewhere"))
    assert default_cache_dir() == tmp_path / "elsewhere"
    tokenize_conversations_cached(CONVERSATIONS, CharTokenizer(), 200, progress=False)
    assert len(list((tmp_path / "elsewhere" / "tokens").iterdir())) == 1
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert default_cache_dir() == token_cache._REPO_ROOT / ".cache" / "lpc"
