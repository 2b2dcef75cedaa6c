"""Prefix linkage on hand-made traces: chains, ties, shared documents and branches."""

from __future__ import annotations

import json

import pytest

from lpc.traces.linkage import block_fanout, link_by_prefix
from tests.lpc.traces.helpers import bundled_lines

SYSTEM = 0  # a system block every request starts with


def shared_system_trace(users: int = 10) -> list[list[int]]:
    """`users` unrelated one-turn chats behind one system block (fan-out `users`)."""
    return [[SYSTEM, 100 + u, 200 + u] for u in range(users)]


def test_turns_of_one_chat_link_into_a_chain() -> None:
    # Each turn repeats the previous prompt's full blocks and adds its own.
    # Two other users share only the system block (fan-out 3 = the threshold: shared).
    trace = [[SYSTEM, 1, 2], [SYSTEM, 1, 3, 4], [SYSTEM, 1, 3, 5, 6], [SYSTEM, 9], [SYSTEM, 10]]
    link = link_by_prefix(trace, shared_fanout=3)
    assert link.parent == [-1, 0, 1, -1, -1]
    assert link.turn_index == [0, 1, 2, 0, 0]
    assert link.conversation == [0, 0, 0, 3, 4]


def test_a_shared_system_block_links_nothing() -> None:
    link = link_by_prefix(shared_system_trace(10), shared_fanout=8)
    assert link.parent == [-1] * 10
    assert link.stats()["shared_blocks"] == 1
    assert block_fanout(shared_system_trace(10))[SYSTEM] == 10
    # Below the threshold the same block would link them: the threshold is what separates.
    assert link_by_prefix(shared_system_trace(10), shared_fanout=11).linked_requests == 9


def test_a_shared_document_deeper_in_the_prompt_links_nothing() -> None:
    # Nine users paste the same two-block document after the system block, then ask apart.
    trace = [[SYSTEM, 50, 51, 300 + u] for u in range(9)]
    link = link_by_prefix(trace, shared_fanout=8)
    assert link.linked_requests == 0


def test_ties_go_to_the_most_recent_request() -> None:
    # Requests 1 and 2 both hold block 1 (as deep as request 3 matches): 3 links to 2.
    trace = [[SYSTEM, 1, 2], [SYSTEM, 1, 3], [SYSTEM, 1, 4], [SYSTEM, 1, 5, 6]]
    link = link_by_prefix(trace, shared_fanout=8)
    assert link.parent == [-1, 0, 1, 2]


def test_the_deepest_shared_prefix_wins_over_recency() -> None:
    trace = [[SYSTEM, 1, 2, 3], [SYSTEM, 1, 4], [SYSTEM, 1, 2, 5]]
    link = link_by_prefix(trace, shared_fanout=8)
    assert link.parent == [-1, 0, 0]


def test_two_later_requests_may_continue_one_parent() -> None:
    # Request 1 edits 0's last block; request 2 extends 0 itself. Both continue 0 (1 shares
    # blocks 0-2 with it, 2 shares blocks 0-3 with it alone) and join its conversation.
    trace = [[SYSTEM, 1, 2, 3], [SYSTEM, 1, 2, 5], [SYSTEM, 1, 2, 3, 6]]
    link = link_by_prefix(trace, shared_fanout=8)
    assert link.parent == [-1, 0, 0]
    assert link.turn_index == [0, 1, 1]
    assert link.conversation == [0, 0, 0]
    assert link.branched_parents == 1


def test_the_threshold_must_leave_room_for_a_chat() -> None:
    with pytest.raises(ValueError, match="shared_fanout"):
        link_by_prefix([[1]], shared_fanout=1)


@pytest.mark.slow  # the whole trace (the tests above link small inputs)
def test_bundled_mooncake_linkage_statistics() -> None:
    ids = [json.loads(line)["hash_ids"] for line in bundled_lines()]
    stats = link_by_prefix(ids).stats()
    assert stats["requests"] == 12031
    # Every Mooncake request starts with the same block: it must not link them all.
    assert stats["shared_blocks"] >= 1 and stats["linked_requests"] < stats["requests"] / 2
    assert (stats["linked_requests"], stats["conversations"]) == (4602, 7429)
