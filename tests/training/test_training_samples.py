"""Samples: one per user turn, the continuation label, windows, the validation cut."""

from __future__ import annotations

import pytest

from training.conversation import Conversation, Message
from training.data import split_samples
from training.samples import (
    build_samples,
    conversation_samples,
    is_validation,
    samples_fingerprint,
    validation_mask,
)
from training.split import split_of


def chat(cid: str, *texts: str, group: str | None = None) -> Conversation:
    roles = ["user", "assistant"] * len(texts)
    return Conversation(
        cid, tuple(Message(r, t) for r, t in zip(roles, texts, strict=False)), group_id=group
    )


def test_one_sample_per_user_turn_and_label_is_has_another_user_turn():
    c = chat("a", "u1", "r1", "u2", "r2", "u3")
    samples = conversation_samples(c, window_size=5)
    assert [s.turn_count for s in samples] == [1, 2, 3]
    assert [s.label for s in samples] == [1, 1, 0]
    assert [s.reply for s in samples] == ["r1", "r2", ""]


def test_window_keeps_the_last_prompts_oldest_first():
    c = chat("a", *[x for i in range(7) for x in (f"u{i}", f"r{i}")])
    samples = conversation_samples(c, window_size=3)
    assert samples[0].window == ("u0",)
    assert samples[6].window == ("u4", "u5", "u6")
    assert samples[6].turn_count == 7


def test_context_counts_every_message_up_to_the_reply():
    c = Conversation(
        "a",
        (
            Message("system", "sys"),
            Message("user", "hello"),
            Message("assistant", "hi!"),
            Message("user", "more"),
        ),
    )
    first, second = conversation_samples(c, 5)
    assert first.context_chars == len("sys") + len("hello") + len("hi!")
    assert second.context_chars == first.context_chars + len("more")


def test_validation_is_stable_grouped_and_near_its_fraction():
    keys = [f"key{i}" for i in range(4000)]
    share = sum(is_validation(k, 0.1) for k in keys) / len(keys)
    assert 0.08 < share < 0.12
    assert [is_validation(k, 0.1) for k in keys[:50]] == [is_validation(k, 0.1) for k in keys[:50]]
    pieces = [chat("x_0", "a", "b", group="x"), chat("x_1", "c", "d", group="x")]
    mask = validation_mask(build_samples(pieces, 5), 0.5)
    assert len(set(mask.tolist())) == 1  # pieces of one chat land together


def test_split_never_puts_an_evaluation_conversation_in_training(conversations):
    split = split_samples(conversations, window_size=5)
    training_keys = {s.split_key for s in split.training_half}
    evaluation_keys = {s.split_key for s in split.evaluation}
    assert training_keys and evaluation_keys
    assert not training_keys & evaluation_keys
    assert all(split_of(k) == "train" for k in training_keys)
    assert all(split_of(k) == "eval" for k in evaluation_keys)
    assert len(split.training_half) + len(split.evaluation) == sum(
        c.num_user_turns for c in conversations
    )


def test_fingerprint_changes_with_labels_and_text(conversations):
    samples = build_samples(conversations[:20], 5)
    base = samples_fingerprint(samples)
    assert base == samples_fingerprint(build_samples(conversations[:20], 5))
    assert base != samples_fingerprint(build_samples(conversations[:19], 5))
    assert base != samples_fingerprint(build_samples(conversations[1:21], 5))


def test_token_counts_are_attached_and_turns_without_them_left_out():
    from training.samples import with_token_counts

    samples = conversation_samples(chat("a", "u1", "r1", "u2", "r2", "u3"), 5)
    kept, without = with_token_counts(samples, {("a", 0): (10, 4), ("a", 1): (30, 6)})
    assert [(s.request_tokens, s.output_tokens) for s in kept] == [(10, 4), (30, 6)]
    assert without == 1
    assert samples[0].request_tokens is None  # the originals are untouched


def test_token_finish_features_read_the_attached_counts():
    import math

    from predictor.access_features import sample_matrix
    from training.samples import with_token_counts

    samples = conversation_samples(chat("a", "u1", "r1", "u2", "r2"), 5)
    kept, _ = with_token_counts(samples, {("a", 0): (10, 4), ("a", 1): (30, 6)})
    names = ("log_request_tokens", "log_output_tokens", "log_prompt_tokens")
    matrix = sample_matrix(kept, names)
    expected = [
        [math.log1p(10), math.log1p(4), math.log1p(6)],
        [math.log1p(30), math.log1p(6), math.log1p(24)],
    ]
    assert matrix.ravel().tolist() == pytest.approx([v for row in expected for v in row], rel=1e-6)
    with pytest.raises(ValueError, match="log_prompt_tokens needs token counts"):
        sample_matrix(samples[:1], ("log_prompt_tokens",))
