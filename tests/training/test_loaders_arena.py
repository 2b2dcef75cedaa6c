"""Chatbot-Arena: side a by default, both on request, one group per question."""

from pathlib import Path

import pytest

from training.loaders import MalformedRecordError, load_conversations

FIXTURES = Path(__file__).parent / "fixtures"


def test_default_mode_yields_side_a_only():
    result = load_conversations(FIXTURES / "arena.json")
    report = result.report
    assert report.format == "arena" and report.mode == "a"
    assert [c.conversation_id for c in result.conversations] == ["q1:a", "q2:a"]
    assert [c.split_key for c in result.conversations] == ["q1", "q2"]
    assert result.conversations[0].messages[1].content == "A joke from a"
    # q3 has no conversation_a
    assert dict(report.skipped) == {"missing_field": 1}


def test_both_mode_keeps_the_good_side_of_a_half_broken_record():
    result = load_conversations(FIXTURES / "arena.json", mode="both")
    # q2's side b and q3's side a are malformed; their other sides are kept
    assert [c.conversation_id for c in result.conversations] == ["q1:a", "q1:b", "q2:a", "q3:b"]
    assert {c.split_key for c in result.conversations[:2]} == {"q1"}
    assert result.conversations[1].messages[1].content == "A joke from b"
    assert dict(result.report.skipped) == {"wrong_type": 1, "missing_field": 1}
    assert any("q2:b" in p for p in result.report.problems)


def test_strict_both_mode_raises_on_the_broken_side():
    with pytest.raises(MalformedRecordError, match=r"record 1.*q2:b.*conversation_b"):
        load_conversations(FIXTURES / "arena.json", mode="both", strict=True)


def test_other_formats_take_no_mode():
    with pytest.raises(ValueError, match="accepts mode none"):
        load_conversations(FIXTURES / "lmsys.jsonl", mode="both")
