"""The stable train/evaluation split."""

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from training.conversation import Conversation, Message
from training.loaders import load_conversations
from training.split import (
    EVAL,
    SPLIT_VERSION,
    TRAIN,
    conversations_in_split,
    partition_conversations,
    split_of,
    split_of_conversation,
)

FIXTURES = Path(__file__).parent / "fixtures"

# Pinned answers: if one changes, every trained model's held-out set has changed too.
GOLDEN = {
    "QWJhYvA": "eval",
    "hRPPgZT": "train",
    "33f01939a744455c869cb234afca47f1": "eval",
    "chatA": "train",
    "d": "train",
    "e": "eval",
}


def test_golden_answers_and_version():
    assert SPLIT_VERSION == "lpc-split-v1"
    assert {key: split_of(key) for key in GOLDEN} == GOLDEN


@given(st.text(min_size=1))
def test_the_rule_is_salted_sha256_of_the_key(key):
    digest = hashlib.sha256(f"lpc-split-v1\0{key}".encode("utf-8", "surrogatepass")).digest()
    assert split_of(key) == ("eval" if digest[0] < 0x80 else "train")


def test_halves_are_balanced():
    counts = {TRAIN: 0, EVAL: 0}
    for i in range(20_000):
        counts[split_of(f"conversation-{i}")] += 1
    assert abs(counts[EVAL] / 20_000 - 0.5) < 0.015


def test_bad_keys_are_rejected():
    for bad in ("", None, 12):
        with pytest.raises(ValueError, match="split_key must be a non-empty str"):
            split_of(bad)


def conversation(conversation_id, group_id=None):
    return Conversation(conversation_id, (Message("user", "hi"),), "test", group_id)


def test_split_uses_the_group_id_when_there_is_one():
    # find two ids that split differently, then group them: they must follow the group
    a = next(f"x{i}" for i in range(100) if split_of(f"x{i}") == TRAIN)
    b = next(f"x{i}" for i in range(100) if split_of(f"x{i}") == EVAL)
    assert split_of_conversation(conversation(a)) == TRAIN
    assert split_of_conversation(conversation(b, group_id=a)) == TRAIN
    assert split_of_conversation(conversation(a, group_id=b)) == EVAL


def test_partition_keeps_order_and_loses_nothing():
    convs = [conversation(f"c{i}") for i in range(200)]
    halves = partition_conversations(convs)
    assert sorted(halves.train + halves.eval, key=convs.index) == convs
    assert halves[TRAIN] == conversations_in_split(convs, TRAIN)
    assert halves[EVAL] == conversations_in_split(convs, EVAL)
    assert all(split_of(c.conversation_id) == EVAL for c in halves.eval)
    with pytest.raises(ValueError, match="split must be one of"):
        conversations_in_split(convs, "test")


def test_sharegpt_segments_land_with_their_merged_chat():
    path = FIXTURES / "sharegpt_segments.json"
    separate = load_conversations(path).conversations
    merged = {c.conversation_id: c for c in load_conversations(path, mode="merge").conversations}
    # the check means something: hashed on their own ids, some pieces would split apart
    assert split_of("chatA_1") != split_of("chatA") and split_of("chatB_0") != split_of("chatB")
    for piece in separate:
        base = piece.conversation_id.rsplit("_", 1)[0] if "_" in piece.conversation_id else None
        whole = merged[base or piece.conversation_id]
        assert split_of_conversation(piece) == split_of_conversation(whole)


def test_both_arena_sides_land_together():
    convs = load_conversations(FIXTURES / "arena.json", mode="both").conversations
    q1 = [c for c in convs if c.split_key == "q1"]
    assert len(q1) == 2 and len({split_of_conversation(c) for c in q1}) == 1
