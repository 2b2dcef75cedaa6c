"""ShareGPT loading: cleaning rules, segments (separate/merge), truncation, malformed items."""

from pathlib import Path

import pytest

from training.conversation import Message
from training.loaders import (
    MalformedRecordError,
    load_conversations,
    sharegpt_base_id,
    split_segment_id,
)

FIXTURES = Path(__file__).parent / "fixtures"


def by_id(result):
    return {c.conversation_id: c for c in result.conversations}


def test_separate_mode_cleans_and_counts_every_change():
    result = load_conversations(FIXTURES / "sharegpt_segments.json")
    report = result.report
    assert report.format == "sharegpt" and report.mode == "separate"
    assert [c.conversation_id for c in result.conversations] == [
        "chatA_0",
        "chatA_1",
        "chatA_3",
        "chatB_0",
        "plain",
    ]
    convs = by_id(result)
    assert convs["chatA_0"].messages == (
        Message("system", "You are terse."),
        Message("user", "Hi"),
        Message("assistant", "Hello."),
        Message("user", "Name a colour."),
        Message("assistant", "Blue."),
    )
    # the leading reply of a later segment has no prompt here: dropped
    assert [m.role for m in convs["chatA_1"].messages] == ["user", "assistant"]
    # two user messages in a row are joined with a blank line; the blank reply and the
    # unknown role are dropped
    assert convs["chatB_0"].messages == (
        Message("user", "First part\n\nsecond part"),
        Message("assistant", "Answer"),
        Message("user", "Follow-up"),
    )
    assert [m.role for m in convs["plain"].messages] == ["user", "assistant"]
    assert report.records_read == 8
    assert report.conversations_produced == 5
    assert dict(report.skipped) == {
        "empty_conversation": 1,
        "no_user_message": 1,
        "duplicate_id": 1,
    }
    assert report.leading_assistant_messages_dropped == 2
    assert report.empty_messages_dropped == 1
    assert report.same_role_messages_merged == 1
    assert dict(report.unknown_roles) == {"tool": 1}
    assert report.roles_seen["chatgpt"] == 1 and report.roles_seen["HUMAN"] == 1
    assert not report.truncated


def test_segments_share_their_base_id_as_group():
    convs = by_id(load_conversations(FIXTURES / "sharegpt_segments.json"))
    assert {convs[i].split_key for i in ("chatA_0", "chatA_1", "chatA_3")} == {"chatA"}
    assert convs["plain"].split_key == "plain"
    assert all(c.source == "sharegpt" for c in convs.values())


def test_merge_mode_joins_segments_in_order_and_reports_gaps():
    result = load_conversations(FIXTURES / "sharegpt_segments.json", mode="merge")
    report = result.report
    convs = by_id(result)
    assert list(convs) == ["chatA", "chatB", "plain"]
    chat_a = convs["chatA"]
    assert chat_a.group_id == "chatA"
    assert [m.content for m in chat_a.messages] == [
        "You are terse.",
        "Hi",
        "Hello.",
        "Name a colour.",
        "Blue.\n\nAlso red.",  # segment 1 starts with a reply: joined to segment 0's last one
        "Thanks",
        "You're welcome.",
        "Back again",
        "Welcome back.",
    ]
    assert report.segments_merged == 2
    assert report.conversations_with_segment_gaps == 1
    assert report.missing_segments == 1  # chatA_2
    # the empty chatB_0 item adds nothing; the second chatB_0 is the chat, not a duplicate
    assert convs["chatB"].messages[0].content == "First part\n\nsecond part"
    # the second "plain" item repeats an id: skipped, never merged into the first
    assert [m.content for m in convs["plain"].messages] == ["Unsuffixed id", "ok"]
    assert dict(report.skipped) == {"no_user_message": 1, "duplicate_id": 1}
    # every base id gives one conversation or one counted skip
    assert report.conversations_produced + report.skipped["no_user_message"] == 4


def test_unknown_mode_is_rejected_with_the_allowed_ones():
    with pytest.raises(ValueError, match="'separate', 'merge'"):
        load_conversations(FIXTURES / "sharegpt_segments.json", mode="both")


@pytest.mark.parametrize(
    ("item_id", "expected"),
    [
        ("QWJhYvA_0", ("QWJhYvA", 0)),
        ("a_b_12", ("a_b", 12)),
        ("abc", ("abc", None)),
        ("abc_", ("abc_", None)),
        ("_7", ("_7", None)),
        ("x_1a", ("x_1a", None)),
    ],
)
def test_segment_id_rule(item_id, expected):
    assert split_segment_id(item_id) == expected
    assert sharegpt_base_id(item_id) == expected[0]


def test_truncated_array_keeps_complete_items_and_reports_the_cut():
    path = FIXTURES / "sharegpt_truncated.json"
    data = path.read_bytes()
    result = load_conversations(path)
    assert [c.conversation_id for c in result.conversations] == ["t_0", "t_1"]
    report = result.report
    assert report.truncated
    assert report.truncated_at_byte == data.index(b'{"id": "t_2"')
    assert report.truncated_bytes == len(data) - report.truncated_at_byte
    assert report.records_read == 2
    assert "cut off" in report.summary()


def test_truncation_is_reported_not_raised_in_strict_mode():
    result = load_conversations(FIXTURES / "sharegpt_truncated.json", strict=True)
    assert len(result) == 2 and result.report.truncated


def test_malformed_items_are_skipped_without_losing_neighbours():
    path = FIXTURES / "sharegpt_malformed.json"
    result = load_conversations(path, format="sharegpt")
    assert [c.conversation_id for c in result.conversations] == ["m_0", "m_2", "m_8"]
    assert result.conversations[0].messages[0].content == "café 日本"
    report = result.report
    assert dict(report.skipped) == {
        "invalid_json": 1,
        "missing_field": 2,
        "wrong_type": 2,
        "not_an_object": 1,
    }
    assert report.malformed_records == 6
    assert report.records_read == 9
    assert any("record 1" in p and "line 3" in p for p in report.problems)


def test_strict_mode_names_file_record_line_and_byte():
    path = FIXTURES / "sharegpt_malformed.json"
    data = path.read_bytes()
    with pytest.raises(MalformedRecordError) as caught:
        load_conversations(path, strict=True)
    message = str(caught.value)
    assert str(path) in message
    assert "record 1" in message and "line 3" in message
    # byte offsets count bytes, not characters ("café 日本" comes before)
    offset = data.index(b'{"id": "m_1"')
    assert offset != data.decode().index('{"id": "m_1"')
    assert f"byte {offset}" in message
    assert "invalid_json: Expecting" in message


def test_limit_stops_early():
    result = load_conversations(FIXTURES / "sharegpt_segments.json", limit=2)
    assert [c.conversation_id for c in result.conversations] == ["chatA_0", "chatA_1"]
    assert result.report.limit_reached
    assert result.report.records_read == 2
