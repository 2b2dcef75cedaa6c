"""OpenAI-style `messages` JSON Lines: content parts, generated ids, odd roles."""

from pathlib import Path

from training.conversation import Message
from training.loaders import load_conversations

FIXTURES = Path(__file__).parent / "fixtures"


def test_messages_jsonl():
    result = load_conversations(FIXTURES / "openai_messages.jsonl")
    report = result.report
    assert report.format == "openai"
    ids = [c.conversation_id for c in result.conversations]
    assert ids[0] == "o1" and ids[2] == "17"
    assert ids[1].startswith("line2-") and len(ids[1]) == len("line2-") + 12
    assert result.conversations[1].messages == (
        Message("system", "Dev prompt"),
        Message("user", "Look at\nthis"),
        Message("assistant", "It is 42"),
    )
    assert dict(report.non_text_parts) == {"image_url": 1}
    assert dict(report.unknown_roles) == {"tool": 1}
    assert report.empty_messages_dropped == 1  # the tool-call turn with null content
    assert report.late_system_messages_dropped == 1
    assert [m.role for m in result.conversations[2].messages] == ["user", "assistant"]
    assert dict(report.skipped) == {"wrong_type": 4}


def test_generated_ids_are_stable_and_depend_on_content(tmp_path):
    first = load_conversations(FIXTURES / "openai_messages.jsonl").conversations[1]
    again = load_conversations(FIXTURES / "openai_messages.jsonl").conversations[1]
    assert first.conversation_id == again.conversation_id
    path = tmp_path / "two.jsonl"
    path.write_text(
        '{"messages": [{"role": "user", "content": "one"}]}\n'
        '{"messages": [{"role": "user", "content": "two"}]}\n'
    )
    a, b = load_conversations(path).conversations
    assert a.conversation_id.startswith("line1-") and b.conversation_id.startswith("line2-")
    assert a.conversation_id[6:] != b.conversation_id[6:]
