"""Dynamic micro-batching: many small concurrent requests, one embedding call per batch.

Requests wait in a bounded FIFO; a batch closes at `max_batch` windows or when the oldest
request has waited `max_wait_s`, and runs on one worker thread while the event loop keeps
queueing. A request that does not fit, by windows or by the expected model time ahead of it
(`max_expected_wait_s`), is refused at once (`QueueFullError` → HTTP 503). The predicting
function is looked up per batch, so a model swap never mixes two models in one batch.

Why, and admission by work: docs/design.md, "Micro-batching and admission".
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from predictor.features import ConversationWindow

PredictFn = Callable[[Sequence[ConversationWindow]], np.ndarray]


class QueueFullError(Exception):
    """The request would push the queue past its bound."""


class BatcherStoppedError(Exception):
    """The batcher is shutting down and takes no new work."""


@dataclass
class _Job:
    windows: list[ConversationWindow]
    tokens: np.ndarray  # int64 cost of each window
    future: asyncio.Future
    enqueued_at: float
    results: np.ndarray = field(init=False)
    next_index: int = 0  # first window not yet handed to a batch
    done_count: int = 0

    def __post_init__(self) -> None:
        self.results = np.empty(len(self.windows), dtype=np.float64)

    @property
    def remaining(self) -> int:
        return len(self.windows) - self.next_index

    @property
    def remaining_tokens(self) -> int:
        return int(self.tokens[self.next_index :].sum())


@dataclass(frozen=True)
class BatchRecord:
    size: int
    seconds: float


class MicroBatcher:
    def __init__(
        self,
        predict: Callable[[], PredictFn],
        max_batch: int,
        max_wait_s: float,
        max_queue_items: int,
        on_batch: Callable[[BatchRecord], None] | None = None,
        on_queue_depth: Callable[[int], None] | None = None,
        max_expected_wait_s: float | None = None,
    ) -> None:
        """`predict()` returns the function to use for the next batch (see module doc).

        `max_expected_wait_s`: also refuse a request when the work ahead of it and its own
        would take longer than this at the measured speed (docs/design.md, "Micro-batching and
        admission"), so a caller
        gets a fast 503 instead of a late timeout when the model is slower than the queue
        bound assumes (a shared CPU, long windows)."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        if max_queue_items < 1:
            raise ValueError(f"max_queue_items must be >= 1, got {max_queue_items}")
        self._predict = predict
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_queue_items = max_queue_items
        self.max_expected_wait_s = max_expected_wait_s
        # Moving averages over batches, None until the first batch has finished.
        self.seconds_per_window: float | None = None
        self.seconds_per_token: float | None = None
        self._on_batch = on_batch or (lambda record: None)
        self._on_queue_depth = on_queue_depth or (lambda depth: None)
        self._jobs: deque[_Job] = deque()
        self._queued_items = 0
        self._queued_tokens = 0
        self._running_tokens = 0  # the batch on the worker thread, 0 when idle
        self._running_since = 0.0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._accepting = False

    @property
    def queued_items(self) -> int:
        """Windows waiting for a batch (the one running is not counted)."""
        return self._queued_items

    @property
    def accepting(self) -> bool:
        """Started and not stopping: `enqueue` takes work."""
        return self._accepting

    @property
    def queued_tokens(self) -> int:
        """Tokens (window costs) waiting for a batch (the one running is not counted)."""
        return self._queued_tokens

    def expected_wait_s(self, tokens: int = 0) -> float | None:
        """Estimated seconds until a request costing `tokens` would be answered if queued
        now: the rest of the running batch, everything queued, then its own windows. The
        speed is the moving average of seconds per token, raised to what the running batch
        has already taken per token when that is more. None before any speed is known."""
        speed = self.seconds_per_token
        elapsed = 0.0
        if self._running_tokens:
            elapsed = time.monotonic() - self._running_since
            taken = elapsed / self._running_tokens
            speed = taken if speed is None else max(speed, taken)
        if speed is None:
            return None
        running_left = self._running_tokens * speed - elapsed
        return running_left + (self._queued_tokens + tokens) * speed

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="predict")
        self._accepting = True
        self._task = asyncio.create_task(self._run(), name="micro-batcher")

    async def stop(self) -> None:
        """Refuse new work, finish everything queued, then stop the worker."""
        self._accepting = False
        if self._wakeup is not None:
            self._wakeup.set()
        if self._task is not None:
            await self._task
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    async def submit(
        self, windows: Sequence[ConversationWindow], tokens: Sequence[int] | None = None
    ) -> np.ndarray:
        """Probabilities for `windows`, in order. Raises QueueFullError when over the bound."""
        return await self.enqueue(windows, tokens)

    def enqueue(
        self, windows: Sequence[ConversationWindow], tokens: Sequence[int] | None = None
    ) -> asyncio.Future:
        """Queue `windows` now (or raise QueueFullError) and return the future of their
        probabilities. `tokens`: each window's cost (default 1 each). Cancelling the future
        drops the windows not yet batched."""
        if not self._accepting or self._wakeup is None:
            raise BatcherStoppedError("the predictor is shutting down")
        costs = (
            np.ones(len(windows), dtype=np.int64)
            if tokens is None
            else np.asarray(tokens, dtype=np.int64)
        )
        if costs.shape != (len(windows),) or np.any(costs < 1):
            raise ValueError(f"tokens must be {len(windows)} integers >= 1, got {tokens!r}")
        work = int(costs.sum())
        refusal = self.refusal(len(windows), work)
        if refusal is not None:
            raise QueueFullError(refusal)
        job = _Job(
            list(windows), costs, asyncio.get_running_loop().create_future(), time.monotonic()
        )
        self._jobs.append(job)
        self._queued_items += len(job.windows)
        self._queued_tokens += work
        self._on_queue_depth(self._queued_items)
        self._wakeup.set()
        return job.future

    def refusal(self, windows: int = 1, tokens: int = 1) -> str | None:
        """Why a request of `windows` windows costing `tokens` would be refused now, or None.
        With the defaults: whether every request would be (the server asks before reading
        a body, so that refusing under overload costs next to nothing).

        An idle batcher (nothing queued, no batch running) admits any request the count
        bound allows: the bound on the expected wait is there to stop queueing, and the speed
        it uses is learned from the batches that ran, so a request refused on an idle server
        would be refused for ever, its own batch being the only one that could correct it
        (a speed learned on short windows overstates long ones: a batch's fixed cost spread
        over few tokens)."""
        if self._queued_items + windows > self.max_queue_items:
            return f"queue holds {self._queued_items} windows, bound {self.max_queue_items}"
        idle = self._queued_items == 0 and self._running_tokens == 0
        if self.max_expected_wait_s is not None and not idle:
            expected = self.expected_wait_s(tokens)
            if expected is not None and expected > self.max_expected_wait_s:
                return (
                    f"expected wait {expected:.2f} s exceeds {self.max_expected_wait_s:.2f} s "
                    f"({self._queued_items} windows of {self._queued_tokens} tokens queued, "
                    f"this request {tokens})"
                )
        return None

    def _observe_speed(self, seconds: float, windows: int, tokens: int) -> None:
        """Moving averages that rise fast (half way to a slower batch) and fall slowly (a
        tenth of the way to a faster one): a machine that slows down is believed at once,
        one that speeds up only once it has shown it for a while."""

        def moving(average: float | None, sample: float) -> float:
            if average is None:
                return sample
            return average + (0.5 if sample > average else 0.1) * (sample - average)

        self.seconds_per_window = moving(self.seconds_per_window, seconds / windows)
        self.seconds_per_token = moving(self.seconds_per_token, seconds / tokens)

    def _take_batch(self) -> list[tuple[_Job, int, int]]:
        """Up to max_batch windows from the head of the queue, as (job, start, end) slices."""
        batch: list[tuple[_Job, int, int]] = []
        room = self.max_batch
        while self._jobs and room > 0:
            job = self._jobs[0]
            if job.future.done():  # cancelled or timed out while waiting: skip its windows
                self._queued_items -= job.remaining
                self._queued_tokens -= job.remaining_tokens
                self._jobs.popleft()
                continue
            take = min(room, job.remaining)
            batch.append((job, job.next_index, job.next_index + take))
            self._queued_tokens -= int(job.tokens[job.next_index : job.next_index + take].sum())
            job.next_index += take
            room -= take
            self._queued_items -= take
            if job.remaining == 0:
                self._jobs.popleft()
        self._on_queue_depth(self._queued_items)
        return batch

    async def _wait_for_batch(self) -> None:
        """Return when a batch should close: full, oldest waited max_wait_s, or stopping."""
        assert self._wakeup is not None
        while not self._jobs:
            if not self._accepting:
                return
            self._wakeup.clear()
            await self._wakeup.wait()
        while self._accepting and self._queued_items < self.max_batch:
            deadline = self._jobs[0].enqueued_at + self.max_wait_s
            delay = deadline - time.monotonic()
            if delay <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=delay)
            except TimeoutError:
                return
            if not self._jobs:
                return

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wait_for_batch()
            if not self._jobs:
                if not self._accepting:
                    return
                continue
            batch = self._take_batch()
            if not batch:
                continue
            windows = [w for job, start, end in batch for w in job.windows[start:end]]
            tokens = sum(int(job.tokens[start:end].sum()) for job, start, end in batch)
            predict = self._predict()
            started = time.perf_counter()
            self._running_tokens, self._running_since = tokens, time.monotonic()
            try:
                probabilities = await loop.run_in_executor(self._executor, predict, windows)
                if len(probabilities) != len(windows):
                    raise RuntimeError(
                        f"predictor returned {len(probabilities)} probabilities "
                        f"for {len(windows)} windows"
                    )
            except Exception as error:  # the batch fails, the server does not
                for job, _, _ in batch:
                    if not job.future.done():
                        job.future.set_exception(error)
                continue
            finally:
                self._running_tokens = 0
            elapsed = time.perf_counter() - started
            self._observe_speed(elapsed, len(windows), tokens)
            self._on_batch(BatchRecord(len(windows), elapsed))
            offset = 0
            for job, start, end in batch:
                job.results[start:end] = probabilities[offset : offset + end - start]
                offset += end - start
                job.done_count += end - start
                if job.done_count == len(job.windows) and not job.future.done():
                    job.future.set_result(job.results)
