"""MicroBatcher without HTTP: batch sizes, order, splitting, bounds, failures, draining."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from predictor.batching import BatcherStoppedError, MicroBatcher, QueueFullError
from predictor.features import ConversationWindow


def windows(n: int, tag: str = "w") -> list[ConversationWindow]:
    return [ConversationWindow(f"{tag}{i}", (f"prompt {tag}{i}",), i + 1) for i in range(n)]


class RecordingModel:
    """Probability = turn_count / 1000, so answers identify their window."""

    def __init__(self, delay_s: float = 0.0, fail_on: int | None = None) -> None:
        self.batches: list[int] = []
        self.delay_s = delay_s
        self.fail_on = fail_on

    def predict(self, batch):
        self.batches.append(len(batch))
        if self.fail_on is not None and len(self.batches) == self.fail_on:
            raise RuntimeError("model exploded")
        time.sleep(self.delay_s)
        return np.array([w.turn_count / 1000 for w in batch])


def run(coroutine):
    return asyncio.run(coroutine)


def test_concurrent_requests_share_batches_and_keep_order():
    model = RecordingModel()

    async def scenario():
        batcher = MicroBatcher(
            lambda: model.predict, max_batch=8, max_wait_s=0.05, max_queue_items=100
        )
        await batcher.start()
        groups = [windows(3, tag=f"g{k}-") for k in range(4)]
        answers = await asyncio.gather(*(batcher.submit(g) for g in groups))
        await batcher.stop()
        return groups, answers

    groups, answers = run(scenario())
    for group, answer in zip(groups, answers, strict=True):
        assert answer.tolist() == [w.turn_count / 1000 for w in group]
    assert model.batches == [8, 4]


def test_a_large_request_is_split_over_batches():
    model = RecordingModel()

    async def scenario():
        batcher = MicroBatcher(
            lambda: model.predict, max_batch=4, max_wait_s=0.0, max_queue_items=100
        )
        await batcher.start()
        answer = await batcher.submit(windows(10))
        await batcher.stop()
        return answer

    assert run(scenario()).tolist() == [(i + 1) / 1000 for i in range(10)]
    assert model.batches == [4, 4, 2]


def test_queue_bound_refuses_whole_requests():
    model = RecordingModel(delay_s=0.2)

    async def scenario():
        depths = []
        batcher = MicroBatcher(
            lambda: model.predict,
            max_batch=2,
            max_wait_s=0.0,
            max_queue_items=5,
            on_queue_depth=depths.append,
        )
        await batcher.start()
        first = asyncio.ensure_future(batcher.submit(windows(2, "a")))
        await asyncio.sleep(0.05)  # the first batch is running, the queue is empty
        second = batcher.enqueue(windows(4, "b"))
        with pytest.raises(QueueFullError):
            batcher.enqueue(windows(2, "c"))
        assert batcher.queued_items == 4
        third = batcher.enqueue(windows(1, "d"))
        await asyncio.gather(first, second, third)
        await batcher.stop()
        return depths

    depths = run(scenario())
    assert max(depths) == 5 and depths[-1] == 0


def test_a_failing_batch_fails_its_requests_only():
    model = RecordingModel(fail_on=1)

    async def scenario():
        batcher = MicroBatcher(
            lambda: model.predict, max_batch=2, max_wait_s=0.0, max_queue_items=10
        )
        await batcher.start()
        with pytest.raises(RuntimeError, match="exploded"):
            await batcher.submit(windows(2))
        answer = await batcher.submit(windows(1))
        await batcher.stop()
        return answer

    assert run(scenario()).tolist() == [0.001]


def test_cancelled_requests_are_not_computed():
    model = RecordingModel(delay_s=0.1)

    async def scenario():
        batcher = MicroBatcher(
            lambda: model.predict, max_batch=1, max_wait_s=0.0, max_queue_items=10
        )
        await batcher.start()
        first = batcher.enqueue(windows(1, "a"))
        await asyncio.sleep(0.02)
        doomed = batcher.enqueue(windows(3, "b"))
        doomed.cancel()
        await first
        await batcher.stop()

    run(scenario())
    assert model.batches == [1]


def test_stop_drains_the_queue_then_refuses():
    model = RecordingModel(delay_s=0.05)

    async def scenario():
        batcher = MicroBatcher(
            lambda: model.predict, max_batch=2, max_wait_s=1.0, max_queue_items=10
        )
        await batcher.start()
        pending = [batcher.enqueue(windows(1, f"x{k}")) for k in range(5)]
        await batcher.stop()
        assert all(p.done() and not p.cancelled() for p in pending)
        with pytest.raises(BatcherStoppedError):
            batcher.enqueue(windows(1))

    run(scenario())
    assert sum(model.batches) == 5


def test_the_model_is_looked_up_per_batch():
    old, new = RecordingModel(), RecordingModel()
    current = {"model": old}

    async def scenario():
        batcher = MicroBatcher(
            lambda: current["model"].predict, max_batch=4, max_wait_s=0.0, max_queue_items=10
        )
        await batcher.start()
        await batcher.submit(windows(2))
        current["model"] = new
        await batcher.submit(windows(3))
        await batcher.stop()

    run(scenario())
    assert old.batches == [2] and new.batches == [3]


def test_wrong_answer_length_is_an_error():
    async def scenario():
        batcher = MicroBatcher(
            lambda: lambda batch: np.zeros(1), max_batch=4, max_wait_s=0.0, max_queue_items=10
        )
        await batcher.start()
        with pytest.raises(RuntimeError, match="returned 1 probabilities for 2"):
            await batcher.submit(windows(2))
        await batcher.stop()

    run(scenario())


def test_requests_that_would_time_out_are_refused_up_front():
    model = RecordingModel(delay_s=0.05)  # 0.05 s per batch of 1 window

    async def scenario():
        batcher = MicroBatcher(
            lambda: model.predict,
            max_batch=1,
            max_wait_s=0.0,
            max_queue_items=100,
            max_expected_wait_s=0.3,
        )
        await batcher.start()
        await batcher.submit(windows(1))  # measures ~0.05 s per window
        assert batcher.seconds_per_window is not None
        pending = [batcher.enqueue(windows(1, f"q{k}")) for k in range(4)]
        with pytest.raises(QueueFullError, match="expected wait"):
            for k in range(20):
                pending.append(batcher.enqueue(windows(1, f"r{k}")))
        assert batcher.queued_items < 10  # refused long before the count bound of 100
        await asyncio.gather(*pending)
        await batcher.stop()

    run(scenario())
