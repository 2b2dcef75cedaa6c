"""The real bundled ShareGPT file, whole: the counts measured when the loaders were written.

Slow (CI step 1b), as the other whole-data-set checks: the default suite runs the same loaders
on small inputs (test_loaders_sharegpt.py) and on the bundled file's first items
(tests/lpc/test_chat_tokenization_sharegpt.py, tests/golden)."""

import pytest

from training.loaders import load_conversations, sharegpt_base_id

pytestmark = pytest.mark.slow

ROLES_SEEN = {
    "gpt": 67_594,
    "human": 61_420,
    "system": 41,
    "chatgpt": 8,
    "bing": 4,
    "bard": 2,
    "user": 2,
}


@pytest.fixture(scope="module")
def separate():
    return load_conversations("sharegpt")


@pytest.fixture(scope="module")
def merged():
    return load_conversations("sharegpt", mode="merge")


def test_separate_mode_reads_every_complete_item(separate):
    report = separate.report
    assert report.records_read == 17_671
    assert dict(report.roles_seen) == ROLES_SEEN
    assert report.truncated and report.truncated_bytes > 0
    assert report.malformed_records == 0 and report.invalid_utf8_bytes_replaced == 0
    # every item is one conversation or one counted skip
    assert report.conversations_produced + report.records_skipped == 17_671
    assert report.conversations_produced == len(separate) > 17_000
    ids = [c.conversation_id for c in separate.conversations]
    assert len(set(ids)) == len(ids)
    assert all(c.split_key == sharegpt_base_id(c.conversation_id) for c in separate.conversations)


def test_merge_mode_gives_one_conversation_or_skip_per_base_id(merged, separate):
    report = merged.report
    assert report.records_read == 17_671
    assert report.conversations_produced + report.records_skipped == 9_460
    assert report.conversations_with_segment_gaps > 0 and report.missing_segments > 0
    merged_ids = {c.conversation_id for c in merged.conversations}
    assert {c.split_key for c in separate.conversations} <= merged_ids
