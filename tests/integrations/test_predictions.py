"""Asynchronous predictions: used when back in time, never waited for, failures counted.

The fake clients block on events, not on sleeps, so nothing here depends on timing; waits
for the worker are bounded polls that fail the test instead of hanging it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from lpc.integrations.predictions import PredictionBoard
from lpc.integrations.stats import PluginStats


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("the prediction worker did not get there in time")
        time.sleep(0.001)


class FakeClient:
    """Answers `answer(items)`, after `gate` opens; records every batch it was sent."""

    def __init__(self, answer: Callable[[Sequence[Mapping[str, Any]]], Any]) -> None:
        self.answer = answer
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.batches: list[list[Mapping[str, Any]]] = []

    def predict(self, items: Sequence[Mapping[str, Any]]) -> list[float] | None:
        self.batches.append(list(items))
        self.entered.set()
        assert self.gate.wait(30), "test gate never opened"
        return self.answer(items)


def item(conversation: str) -> dict[str, Any]:
    return {"conversation_id": conversation, "user_prompts": ["hi"], "turn_count": 1}


def by_conversation(items: Sequence[Mapping[str, Any]]) -> list[float]:
    return [0.25 if i["conversation_id"] == "a" else 0.75 for i in items]


def test_an_answer_back_in_time_is_used() -> None:
    stats = PluginStats()
    board = PredictionBoard(FakeClient(by_conversation), stats)
    assert board.ask("r1", item("a")) and board.ask("r2", item("b"))
    assert not board.ask("r1", item("a")), "a request is asked for once"
    wait_until(lambda: board.in_flight == 0)
    assert (board.take("r1"), board.take("r2")) == (0.25, 0.75)
    assert board.take("r1") is None, "a prediction is consumed once"
    s = stats.snapshot()
    assert s["predictions_requested"] == 2 and s["predictions_answered"] == 2
    assert s["predictions_late"] == 0 and board.pending == 0
    board.close()


def test_a_late_answer_is_not_waited_for_and_then_dropped() -> None:
    stats = PluginStats()
    client = FakeClient(by_conversation)
    client.gate.clear()
    board = PredictionBoard(client, stats)
    board.ask("r1", item("a"))
    assert client.entered.wait(10)
    assert board.claim("r1") == (None, False)  # at once, though busy; no `on_late` to wait
    assert stats.predictions_late == 1
    client.gate.set()
    wait_until(lambda: stats.predictor_calls == 1)
    assert board.pending == 0, "the late answer must not be kept"
    board.close()


@pytest.mark.parametrize(
    "answer",
    [
        lambda items: None,  # the client's "failed" (timeout, refused, overloaded)
        lambda items: [0.5],  # one answer for two items
        lambda items: [1.5, 0.5],  # not a probability
        lambda items: [float("nan"), 0.5],
    ],
    ids=["none", "short", "out-of-range", "nan"],
)
def test_failed_or_malformed_answers_fall_back(answer: Callable[..., Any]) -> None:
    stats = PluginStats()
    client = FakeClient(answer)
    client.gate.clear()
    board = PredictionBoard(client, stats)
    board.ask("r1", item("a"))
    board.ask("r2", item("b"))
    client.gate.set()
    wait_until(lambda: board.in_flight == 0)
    assert board.take("r1") is None and board.take("r2") is None
    assert stats.predictor_failures >= 1 and stats.predictions_answered == 0
    board.close()


def test_a_raising_client_does_not_kill_the_worker() -> None:
    calls = []

    def answer(items: Sequence[Mapping[str, Any]]) -> list[float]:
        calls.append(len(items))
        if len(calls) == 1:
            raise RuntimeError("boom")
        return [0.9] * len(items)

    stats = PluginStats()
    board = PredictionBoard(FakeClient(answer), stats)
    board.ask("r1", item("a"))
    wait_until(lambda: stats.predictor_calls == 1)
    board.ask("r2", item("a"))
    wait_until(lambda: board.in_flight == 0)
    assert board.take("r1") is None and board.take("r2") == 0.9
    assert stats.predictor_failures == 1
    board.close()


def test_requests_queued_behind_a_busy_call_go_out_as_one_batch() -> None:
    stats = PluginStats()
    client = FakeClient(by_conversation)
    client.gate.clear()
    board = PredictionBoard(client, stats, max_batch=64)
    board.ask("first", item("a"))
    assert client.entered.wait(10)
    for i in range(10):
        board.ask(f"r{i}", item("b"))
    client.gate.set()
    wait_until(lambda: board.in_flight == 0)
    assert [len(batch) for batch in client.batches] == [1, 10]
    board.close()


def test_released_requests_are_not_sent() -> None:
    stats = PluginStats()
    client = FakeClient(by_conversation)
    client.gate.clear()
    board = PredictionBoard(client, stats)
    board.ask("first", item("a"))
    assert client.entered.wait(10)
    board.ask("gone", item("b"))
    board.forget("gone")
    client.gate.set()
    wait_until(lambda: stats.predictor_calls == 1)
    board.ask("sync", item("a"))  # a later batch proves the queue was drained
    wait_until(lambda: board.in_flight == 0)
    assert all(i["conversation_id"] != "b" for batch in client.batches for i in batch)
    board.close()


def test_pending_predictions_are_bounded() -> None:
    stats = PluginStats()
    client = FakeClient(by_conversation)
    client.gate.clear()
    board = PredictionBoard(client, stats, max_pending=3)
    asked = [board.ask(f"r{i}", item("a")) for i in range(5)]
    assert asked == [True, True, True, False, False]
    assert stats.predictions_dropped == 2 and board.pending == 3
    client.gate.set()
    board.close()


def test_no_worker_thread_until_the_first_prediction() -> None:
    before = {t.name for t in threading.enumerate()}
    board = PredictionBoard(FakeClient(by_conversation), PluginStats())
    assert "lpc-predictions" not in {t.name for t in threading.enumerate()} - before
    board.close()  # closing an idle board is fine
