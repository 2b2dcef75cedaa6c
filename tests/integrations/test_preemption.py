"""A preempted request's blocks are the last to go until it is rescheduled.

vLLM's `Scheduler._preempt_request` frees a request's blocks while it is still RUNNING; the
scheduler class's free path sees `is_finished()` False and releases them as a
`ProtectedRelease`: after every free block, whatever the request's predicted p, without asking
for a prediction, and with its hints kept for the release that finishes it. The stand-in
engine is test_fail_safe.py's (LPC on it as the scheduler class runs it); the real scheduler's
counterpart is test_vllm_scheduler.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from lpc.integrations.vllm_plugin import is_unfinished
from lpc.integrations.vllm_queue import ProtectedRelease
from tests.integrations.test_fail_safe import Block, Engine, Request, make_runtime


@dataclass
class RunningRequest(Request):
    finished: bool = False

    def is_finished(self) -> bool:
        return self.finished


def engine(evictor: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, Any]:
    runtime = make_runtime(evictor)
    manager = Engine(runtime, [Block(i) for i in range(12)])
    return runtime, manager, manager.block_pool.free_block_queue


def request(rid: str, p: float, conversation: str, index: int) -> RunningRequest:
    extra = {"lpc_probability": p, "lpc_conversation_id": conversation}
    return RunningRequest(rid, index, extra)


@pytest.mark.parametrize("evictor", ["lpc", "lpc-pooled", "lpc-return"])
def test_a_preempted_request_is_evicted_last(evictor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, manager, queue = engine(evictor, monkeypatch)
    clock = runtime.queues.clock
    likely = request("likely", 0.99, "a", 0)
    preempted = request("preempted", 0.01, "b", 1)
    manager.allocate_slots(likely, [b"a1", b"a2", b"a3"])
    manager.allocate_slots(preempted, [b"b1", b"b2", b"b3"])
    clock.now += 1
    likely.finished = True
    manager.free(likely)  # a finished turn
    clock.now += 1
    manager.free(preempted)  # still RUNNING: preempted
    order = [block.block_hash for block in queue.get_all_free_blocks() if block.block_hash]
    # Its p is 0.01, yet its blocks go after the p = 0.99 conversation's, tail first.
    assert order == [b"a3", b"a2", b"a1", b"b3", b"b2", b"b1"]
    stats = runtime.stats.snapshot()
    assert stats["preemptions"] == 1 and stats["protected_blocks_released"] == 3
    assert stats["releases"] == 1  # the finished one: a preemption is not a release
    # Its hints wait for the release that finishes it, with its own p.
    assert "preempted" in runtime.hints
    manager.allocate_slots(preempted, [b"b1", b"b2", b"b3"])  # rescheduled: all three hit
    assert manager.hits == 3
    preempted.finished = True
    release = runtime.release_for(preempted)
    assert not isinstance(release, ProtectedRelease)
    assert (release.probability, release.conversation_id) == (0.01, "b")


def test_only_an_unfinished_vllm_request_is_a_preemption() -> None:
    assert is_unfinished(RunningRequest("r", 0, {}))
    assert not is_unfinished(RunningRequest("r", 0, {}, finished=True))
    assert not is_unfinished(Request("r", 0, {}))  # no is_finished(): a finished request


def test_preempting_an_unknown_request_still_protects(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request preempted before the plugin saw it scheduled: its hints are read then."""
    runtime, manager, _ = engine("lpc", monkeypatch)
    preempted = request("p", 0.2, "c", 0)
    manager.allocate_slots(preempted, [b"c1"])
    runtime.hints.clear()
    release = runtime.release_for(preempted)
    assert isinstance(release, ProtectedRelease) and release.conversation_id == "c"
    assert runtime.hints["p"].probability == 0.2
