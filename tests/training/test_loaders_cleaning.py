"""The shared cleaning rules, applied in their documented order."""

import pytest

from training.conversation import Message
from training.loaders.cleaning import RecordProblem, content_text, normalise_messages, record_id
from training.loaders.report import LoadReport, SkipReason


def clean(pairs):
    report = LoadReport(source="test", format="test")
    return normalise_messages(pairs, report), report


def test_system_messages_before_the_first_prompt_are_kept_and_merged():
    messages, report = clean(
        [("system", "rules"), ("gpt", "stray reply"), ("system", "more rules"), ("human", "hi")]
    )
    assert messages == (Message("system", "rules\n\nmore rules"), Message("user", "hi"))
    assert report.leading_assistant_messages_dropped == 1
    assert report.same_role_messages_merged == 1


def test_late_system_messages_are_dropped_and_the_turns_around_them_stay_apart():
    messages, report = clean([("user", "a"), ("assistant", "b"), ("system", "s"), ("user", "c")])
    assert [m.role for m in messages] == ["user", "assistant", "user"]
    assert report.late_system_messages_dropped == 1


def test_dropping_an_empty_reply_merges_the_prompts_around_it():
    messages, report = clean([("user", "a"), ("assistant", " \n\t"), ("user", "b")])
    assert messages == (Message("user", "a\n\nb"),)
    assert report.empty_messages_dropped == 1 and report.same_role_messages_merged == 1


def test_text_is_kept_exactly_and_roles_are_case_insensitive():
    messages, report = clean([(" Human ", "  padded \n"), ("Model", "x"), ("GPT", "ok ")])
    assert messages == (Message("user", "  padded \n"), Message("assistant", "ok "))
    assert dict(report.unknown_roles) == {"Model": 1}
    assert report.roles_seen[" Human "] == 1


def test_content_parts():
    report = LoadReport(source="test", format="test")
    parts = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {}},
        "b",
        {"type": "input_audio"},
    ]
    assert content_text(parts, report, "m") == "a\nb"
    assert dict(report.non_text_parts) == {"image_url": 1, "input_audio": 1}
    assert content_text(None, report, "m") == ""
    for bad in (3, {"text": "x"}, [{"text": "no type"}], [{"type": "text", "text": None}]):
        with pytest.raises(RecordProblem) as caught:
            content_text(bad, report, "m")
        assert caught.value.reason is SkipReason.WRONG_TYPE


def test_lone_surrogates_become_replacement_characters():
    messages, report = clean([("user", "pair \U0001f642 half \ud83d end")])
    assert messages[0].content == "pair \U0001f642 half \ufffd end"
    assert report.lone_surrogates_replaced == 1
    messages[0].content.encode("utf-8")  # encodable now


def test_an_id_holding_a_lone_surrogate_is_refused_not_repaired():
    with pytest.raises(RecordProblem) as caught:
        record_id({"id": "\ud800x"}, "id")
    assert caught.value.reason is SkipReason.INVALID_ID
    assert "'id' is not valid Unicode: a lone surrogate \\ud800 at character 0" in str(caught.value)
    assert record_id({"id": "pair \U0001f642"}, "id") == "pair \U0001f642"
    assert record_id({"id": "dup\ufffd"}, "id") == "dup\ufffd"  # a real U+FFFD is text


def test_ids_holding_lone_surrogates_are_counted_and_never_merge(tmp_path):
    """Issue 44, case 5: `dup\\ud800`, `dup\\udbff` and `dup\\ufffd` loaded as one
    conversation, two of them reported as `duplicate_id`."""
    import json

    from training.loaders import MalformedRecordError, load_conversations

    path = tmp_path / "chats.jsonl"
    ids = ["dup\ud800", "dup\udbff", "dup\ufffd"]
    path.write_text(
        "".join(
            json.dumps({"id": i, "conversations": [{"from": "human", "value": f"hi {n}"}]}) + "\n"
            for n, i in enumerate(ids)
        )
    )
    assert "\\ud800" in path.read_text()  # as a JSON dump spells it
    result = load_conversations(path, format="sharegpt")
    assert [c.conversation_id for c in result.conversations] == ["dup\ufffd"]
    assert dict(result.report.skipped) == {"invalid_id": 2}
    assert result.report.problems[0] == (
        f"{path}: record 0, line 1, byte 0: invalid_id: 'id' is not valid Unicode: a lone "
        "surrogate \\ud800 at character 3 (half of a UTF-16 pair; an id cannot be repaired "
        "without merging it with another)"
    )
    with pytest.raises(MalformedRecordError, match=r"record 0, line 1, byte 0: invalid_id"):
        load_conversations(path, format="sharegpt", strict=True)
