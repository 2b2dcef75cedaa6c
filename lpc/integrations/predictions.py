"""Asynchronous continuation predictions, asked for when a request starts, read when it ends.

`ask` queues the request's item and returns at once, one worker thread sends everything queued
as one batch to the predictor, and `claim` at release time returns the answer if it is there
and None otherwise (the caller then uses its fallback p). Nothing on the engine's hot path ever
waits for the predictor; a late answer goes to `on_late` (the free queues re-key the release).

Bounds and checks: docs/design.md, "Predictions beside inference".
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from lpc.integrations.stats import PluginStats, is_probability

logger = logging.getLogger(__name__)

_PENDING = object()  # asked for, no answer yet
_LATE = object()  # asked for, released before its answer came: the answer goes to `on_late`
_STOP = object()


class PredictionClient(Protocol):
    """The predictor RPC client's contract (`predictor.client.PredictorClient`).

    `predict` returns one probability per item, in order, or None on any failure (timeout,
    refused connection, overload, malformed answer) within its own deadline; it never raises.
    """

    def predict(self, items: Sequence[Mapping[str, Any]]) -> list[float] | None: ...


class PredictionBoard:
    """Predictions keyed by request id, filled in by one background worker."""

    def __init__(
        self,
        client: PredictionClient,
        stats: PluginStats,
        max_pending: int = 4096,
        max_batch: int = 64,
        on_late: Callable[[str, float], None] | None = None,
    ) -> None:
        if max_pending < 1 or max_batch < 1:
            raise ValueError("max_pending and max_batch must be >= 1")
        self._client = client
        self._stats = stats
        self._max_pending = max_pending
        self._max_batch = max_batch
        # Where an answer goes that comes after its request was released (None: dropped).
        self._on_late = on_late
        self._lock = threading.Lock()
        # request id -> _PENDING or the probability (None: the predictor failed)
        self._answers: dict[str, object] = {}
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        # Started by the first `ask`: vLLM registers plugins in processes that never serve.
        self._worker: threading.Thread | None = None

    def ask(self, request_id: str, item: Mapping[str, Any]) -> bool:
        """Queue a prediction for the request; False when it was already asked or is dropped."""
        with self._lock:
            if request_id in self._answers:
                return False
            if len(self._answers) >= self._max_pending:
                dropped = True
            else:
                dropped = False
                self._answers[request_id] = _PENDING
                if self._worker is None:
                    self._worker = threading.Thread(
                        target=self._run, name="lpc-predictions", daemon=True
                    )
                    self._worker.start()
        if dropped:
            self._stats.add(predictions_dropped=1)
            return False
        self._stats.add(predictions_requested=1)
        self._queue.put((request_id, item))
        return True

    def has(self, request_id: str) -> bool:
        """Whether a prediction for the request is pending or waiting to be taken."""
        return request_id in self._answers

    def take(self, request_id: str) -> float | None:
        """The request's prediction if it has arrived, else None (`claim`)."""
        return self.claim(request_id)[0]

    def claim(self, request_id: str) -> tuple[float | None, bool]:
        """At the request's release: its prediction if it has arrived, and whether it is
        still on its way to `on_late` (then the p is None). The request is forgotten, or,
        when its answer is on its way and `on_late` is set, kept until the answer comes."""
        with self._lock:
            answer = self._answers.pop(request_id, None)
            coming = answer is _PENDING and self._on_late is not None
            if coming or answer is _LATE:
                self._answers[request_id] = _LATE
        if answer is _PENDING:
            # Without `on_late` the worker finds no entry when the answer comes, and drops it.
            self._stats.add(predictions_late=1)
            return None, coming
        if answer is _LATE:  # claimed before: its answer goes to `on_late` once
            return None, False
        return answer, False  # type: ignore[return-value]

    def forget(self, request_id: str) -> None:
        """Drop the request's entry without counting it (it will never be released)."""
        with self._lock:
            self._answers.pop(request_id, None)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker after the batch it is sending (for tests and orderly shutdown)."""
        with self._lock:
            worker = self._worker
        if worker is not None:
            self._queue.put(_STOP)
            worker.join(timeout_s)

    @property
    def pending(self) -> int:
        """Requests asked for and not yet taken (answered or not)."""
        return len(self._answers)

    @property
    def in_flight(self) -> int:
        """Requests whose prediction has not come back yet."""
        with self._lock:
            return sum(1 for answer in self._answers.values() if answer in _ON_THEIR_WAY)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            while len(batch) < self._max_batch:
                try:
                    entry = self._queue.get_nowait()
                except queue.Empty:
                    break
                if entry is _STOP:
                    stop = True
                    break
                batch.append(entry)
            self._answer(batch)  # type: ignore[arg-type]
            if stop:
                return

    def _answer(self, batch: list[tuple[str, Mapping[str, Any]]]) -> None:
        with self._lock:
            # Requests released while queued need no answer (unless `on_late` takes it).
            live = [(rid, item) for rid, item in batch if self._answers.get(rid) in _ON_THEIR_WAY]
        if not live:
            return
        try:
            probabilities = self._client.predict([item for _, item in live])
        except Exception as error:  # the client must not raise; if it does, never kill the worker
            if self._stats.first_time("the predictor client raised"):
                logger.error(
                    "the predictor client raised; treating it as a failed call (logged once)",
                    exc_info=error,
                )
            probabilities = None
        if probabilities is not None and not _valid_answer(probabilities, len(live)):
            # One bad value discredits the whole answer: each of its requests gets the
            # fallback p. The bad values are counted (and the first one logged) as such.
            listed = probabilities if isinstance(probabilities, list) else []
            bad = [p for p in listed if not is_probability(p)]
            for value in bad:
                self._stats.invalid_probability("the predictor", value)
            if not bad and self._stats.first_time("malformed predictor answer"):
                logger.warning(
                    "the predictor answered %.200r for %d items; ignoring the answer (logged "
                    "once; counted in predictor_failures)",
                    probabilities,
                    len(live),
                )
            probabilities = None
        late: list[tuple[str, float]] = []
        with self._lock:
            for i, (rid, _) in enumerate(live):
                answer = self._answers.get(rid)
                if answer is _PENDING:
                    self._answers[rid] = None if probabilities is None else probabilities[i]
                elif answer is _LATE:
                    del self._answers[rid]
                    if probabilities is not None:
                        late.append((rid, float(probabilities[i])))
        on_late = self._on_late
        if late and on_late is not None:
            for rid, probability in late:
                try:
                    on_late(rid, probability)
                except Exception as error:  # never kill the worker
                    self._stats.plugin_error("delivering a late prediction", error)
        if probabilities is None:
            self._stats.add(predictor_calls=1, predictor_failures=1)
        else:
            self._stats.add(predictor_calls=1, predictions_answered=len(live))


_ON_THEIR_WAY = (_PENDING, _LATE)


def _valid_answer(probabilities: object, count: int) -> bool:
    """One finite number in [0, 1] per item, in a list."""
    return (
        isinstance(probabilities, list)
        and len(probabilities) == count
        and all(is_probability(p) for p in probabilities)
    )
