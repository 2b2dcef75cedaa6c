"""Predictions that come back after their request released its blocks, on their way to the
free queues that queued those blocks at the fallback p (LRU's place).

The predictor's worker thread delivers each late answer (`deliver`) to every LPC queue of the
process; each queue drains its own inbox on the scheduler thread, at its next call, and
re-keys the release's own runs (`LPCEvictor.rekey_late`: one heap push per run). An inbox is
bounded: past `MAX_WAITING` undrained answers the oldest are dropped, as the queue forgets the
oldest releases waiting for one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# Releases a queue keeps waiting for their prediction, and answers an inbox keeps undrained:
# the prediction board's default bound on requests asked for (`max_pending_predictions`).
MAX_WAITING = 4096


@dataclass
class LatePredictions:
    """Every LPC queue's inbox of (request id, p) answers that came after the release."""

    inboxes: list[deque[tuple[str, float]]] = field(default_factory=list)

    def inbox(self) -> deque[tuple[str, float]]:
        """A new queue's inbox (a deque: appended by the worker, drained by the scheduler)."""
        inbox: deque[tuple[str, float]] = deque(maxlen=MAX_WAITING)
        self.inboxes.append(inbox)
        return inbox

    def deliver(self, request_id: str, probability: float) -> None:
        """Hand a late answer to every queue (called on the predictor's worker thread)."""
        for inbox in self.inboxes:
            inbox.append((request_id, probability))
