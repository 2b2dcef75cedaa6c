"""Tokenising real ShareGPT conversations with the default (Qwen3) tokenizer."""

from itertools import pairwise

import pytest

from lpc.chat.tokenization import DEFAULT_MAX_MODEL_LEN, tokenize_conversations
from training.loaders import load_conversations

NEWLINE = 198


def check_invariants(result, max_model_len):
    report = result.report
    assert report.turns_kept + report.turns_dropped == report.user_turns
    assert report.turns_kept == len(result.turns)
    for conversation in result.conversations:
        ids = conversation.token_ids
        turns = conversation.turns
        assert len(ids) == turns[-1].num_request_tokens <= max_model_len
        for before, after in pairwise(turns):
            # the next prompt starts with this whole request and the template's newline
            assert after.num_prompt_tokens > before.num_request_tokens
            assert ids[before.num_request_tokens] == NEWLINE
        for turn in turns:
            assert ids[turn.num_prompt_tokens - 3 : turn.num_prompt_tokens].tolist() == [
                151644,
                77091,
                NEWLINE,
            ]  # <|im_start|>assistant\n
            assert ids[turn.num_request_tokens - 1] == 151645  # <|im_end|>
        assert [t.has_next_turn for t in turns] == [True] * (len(turns) - 1) + [False]


def test_a_slice_of_sharegpt():
    conversations = load_conversations("sharegpt", limit=300).conversations
    result = tokenize_conversations(conversations, max_model_len=4096, progress=False)
    check_invariants(result, 4096)
    assert result.report.turns_dropped > 0  # the small limit cuts some conversations


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["separate", "merge"])
def test_all_of_sharegpt(mode):
    conversations = load_conversations("sharegpt", mode=mode).conversations
    result = tokenize_conversations(conversations, progress=False)
    check_invariants(result, DEFAULT_MAX_MODEL_LEN)
    assert result.report.conversations == len(conversations)
    if mode == "separate":
        assert result.report.user_turns == 61_210
