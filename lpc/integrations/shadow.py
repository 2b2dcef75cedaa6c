"""Shadow mode: what LPC and LRU would hit on the engine's own traffic, before LPC evicts.

While the mode is `shadow` the engine evicts in stock vLLM's order (`kill_switch`), and the
plugin replays the same requests through two metadata-only block managers of the engine's
size, one with the configured learned evictor and one with LRU, and exports their token hit
ratios. The scheduler thread only queues events (`ShadowFeed`); a background thread applies
them in order, so the figures are deterministic.

Which requests, when, and with what: docs/design.md, "Shadow mode".
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eviction.base import Evictor
from eviction.lru import LRUEvictor
from lpc.blocks.block_manager import CacheRequest, PrefixCacheBlockManager, UnknownRequestError
from lpc.integrations.kill_switch import ModeSwitch
from lpc.integrations.stats import PluginStats

logger = logging.getLogger("vllm.plugins.lpc")

CACHES = ("lpc", "lru")
# Events queued and not applied yet beyond which the shadow stops (a background thread that
# falls this far behind would only grow memory); it starts again the next time shadow mode
# is entered.
DEFAULT_MAX_BACKLOG = 200_000


@dataclass(frozen=True, slots=True)
class Admission:
    """A request's first scheduling: its prompt's tokens and full-block hashes."""

    request_id: str
    conversation_id: str
    time_s: float
    num_tokens: int
    block_hashes: list[Any]


@dataclass(frozen=True, slots=True)
class Finish:
    """A finished request's release: its computed tokens, their full-block hashes, its p and
    its return curve (for `lpc-return`; None without a return-time model)."""

    request_id: str
    time_s: float
    probability: float | None
    num_tokens: int
    block_hashes: list[Any]
    return_curve: Any = None


@dataclass(frozen=True, slots=True)
class Start:
    """Shadow mode entered: fresh caches of the engine's pool (null block included)."""

    num_blocks: int
    block_size: int


@dataclass
class ShadowCounters:
    """The shadow's figures since it last started (`requests`, `queries` are the same for both
    caches; the rest per cache)."""

    requests: int = 0
    queries: int = 0  # tokens looked up
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CACHES, 0))
    hit_requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CACHES, 0))
    allocation_failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CACHES, 0))
    evictions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CACHES, 0))

    def hit_ratio(self, cache: str) -> float:
        return self.hits[cache] / self.queries if self.queries else 0.0


class ShadowCaches:
    """The two metadata-only caches and their counters; applies events in order."""

    def __init__(self, num_blocks: int, block_size: int, learned: Evictor) -> None:
        self.block_size = block_size
        self.managers = {
            "lpc": PrefixCacheBlockManager(num_blocks, block_size, evictor=learned),
            "lru": PrefixCacheBlockManager(num_blocks, block_size, evictor=LRUEvictor(num_blocks)),
        }
        self.counters = ShadowCounters()

    def admit(self, event: Admission) -> None:
        c = self.counters
        c.requests += 1
        c.queries += event.num_tokens
        request = CacheRequest(
            event.request_id,
            range(event.num_tokens),  # no tokens are held: only the length is read
            event.num_tokens,
            conversation_id=event.conversation_id,
            block_hashes=event.block_hashes,
        )
        for name, manager in self.managers.items():
            prefix = manager.find_computed_prefix(request, event.block_hashes)
            allocation = manager.allocate(request, prefix, event.time_s)
            if allocation is None:
                c.allocation_failures[name] += 1
                continue
            c.hits[name] += allocation.num_hit_tokens
            c.hit_requests[name] += allocation.num_hit_tokens > 0
            c.evictions[name] += len(allocation.evicted_block_ids)

    def finish(self, event: Finish) -> None:
        c = self.counters
        for name, manager in self.managers.items():
            evictions = manager.counters.evictions
            try:
                manager.grow(event.request_id, event.num_tokens, event.block_hashes, event.time_s)
            except UnknownRequestError:  # this cache could not hold it at its admission
                continue
            c.evictions[name] += manager.counters.evictions - evictions
            manager.free(
                event.request_id, event.time_s, event.probability, return_curve=event.return_curve
            )


class ShadowFeed:
    """The scheduler thread's side of the shadow: notes admissions and finishes, queues them
    to a background thread that applies them to `ShadowCaches`.

    `scheduled` and `finished` never raise: an error costs the shadow its figures' accuracy
    (counted in `plugin_errors` and `shadow_errors`), never a request.
    """

    def __init__(
        self,
        switch: ModeSwitch,
        stats: PluginStats,
        new_learned_evictor: Callable[[int], Evictor],
        clock: Callable[[], float],
        learned_name: str = "lpc",
        max_backlog: int = DEFAULT_MAX_BACKLOG,
    ) -> None:
        self.switch = switch
        self.stats = stats
        self.new_learned_evictor = new_learned_evictor
        self.clock = clock
        self.learned_name = learned_name
        self.max_backlog = max_backlog
        self.active = False  # feeding caches now (scheduler thread's view)
        self.starts = 0
        self.errors = 0
        self.overflows = 0
        # The events applied, in order, when a list is put here (tests, the scheduler replay).
        self.events: list[Admission | Finish | Start] | None = None
        self.caches: ShadowCaches | None = None
        self.counters = ShadowCounters()
        self._block_size = 0
        self._tracked: dict[str, bool] = {}  # request id -> entered (False: left out)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._queued = 0  # written by the scheduler thread only
        self._applied = 0  # written by the worker only
        self._applied_changed = threading.Condition()
        self._worker: threading.Thread | None = None
        self._overflowed = False

    # -- the scheduler thread ----------------------------------------------------------------
    def scheduled(
        self, request: Any, pool: Any, conversation_of: Callable[[Any], str | None]
    ) -> None:
        """`allocate_slots` succeeded for `request` in `pool`: its admission, the first time
        (`conversation_of` reads its conversation id then; None: the request id)."""
        try:
            self._sync(pool)
            if not self.active:
                return
            rid = request.request_id
            if rid in self._tracked:
                return
            if request.num_computed_tokens or request.num_preemptions:
                self._tracked[rid] = False  # it ran before the shadow started
                return
            num_tokens = request.num_tokens
            hashes = request.block_hashes[: num_tokens // self._block_size]
            conversation_id = conversation_of(request) or rid
            self._tracked[rid] = True
            self._put(Admission(rid, conversation_id, self.clock(), num_tokens, hashes))
        except Exception as error:
            self._error("noting a request's admission", error)

    def finished(self, request: Any, release: Any) -> None:
        """vLLM frees `request` with `release`: its finish, if it is finished and entered."""
        try:
            self._sync(None)
            if not self.active:
                return
            rid = request.request_id
            entered = self._tracked.get(rid)
            if entered is None or not request.is_finished():
                return  # never entered, or preempted: the shadow keeps its blocks
            del self._tracked[rid]
            if not entered:
                return
            num_tokens = request.num_computed_tokens
            hashes = request.block_hashes[: num_tokens // self._block_size]
            self._put(
                Finish(
                    rid,
                    release.time_s,
                    release.probability,
                    num_tokens,
                    hashes,
                    release.return_curve,
                )
            )
        except Exception as error:
            self._error("noting a request's finish", error)

    def _sync(self, pool: Any | None) -> None:
        """Follow the mode: start on entering shadow mode (at an admission, which knows the
        pool), stop on leaving it."""
        shadow = self.switch.mode == "shadow"
        if not shadow:
            self._overflowed = False
        if self.active == shadow:
            return
        if not shadow:
            self._stop()
        elif pool is not None and not self._overflowed:
            self._start(pool)

    def _start(self, pool: Any) -> None:
        self._block_size = int(pool.hash_block_size)
        self._tracked = {}
        self.active = True
        self.starts += 1
        self._put(Start(int(pool.num_gpu_blocks), self._block_size))
        logger.info(
            "LPC shadow caches started: %d blocks of %d tokens, %s and LRU",
            pool.num_gpu_blocks,
            self._block_size,
            self.learned_name,
        )

    def _stop(self) -> None:
        self.active = False
        self._tracked = {}
        self._put(None)  # the worker drops the caches; the counters stay

    def _put(self, event: Admission | Finish | Start | None) -> None:
        if self._queued - self._applied >= self.max_backlog:
            self.overflows += 1
            self.active = False
            self._overflowed = True
            self._tracked = {}
            logger.error(
                "LPC shadow caches stopped: %d events wait to be applied; they start again "
                "the next time shadow mode is entered",
                self._queued - self._applied,
            )
            event = None
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="lpc-shadow", daemon=True)
            self._worker.start()
        self._queued += 1
        self._queue.put(("event", event))

    def _error(self, where: str, error: BaseException) -> None:
        self.errors += 1
        self.stats.plugin_error(f"shadow mode: {where}", error)

    # -- the background thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            kind, event = self._queue.get()
            if kind == "close":
                return
            try:
                self._apply(event)
            except Exception as error:
                self._error("applying an event to the shadow caches", error)
            finally:
                with self._applied_changed:
                    self._applied += 1
                    self._applied_changed.notify_all()

    def _apply(self, event: Admission | Finish | Start | None) -> None:
        if event is None:
            self.caches = None
            return
        if self.events is not None:
            self.events.append(event)
        if isinstance(event, Start):
            learned = self.new_learned_evictor(event.num_blocks)
            self.caches = ShadowCaches(event.num_blocks, event.block_size, learned)
            self.counters = self.caches.counters
        elif self.caches is None:
            return
        elif isinstance(event, Admission):
            self.caches.admit(event)
        else:
            self.caches.finish(event)

    # -- any thread ----------------------------------------------------------------------------
    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait until every event queued so far is applied; False on timeout."""
        target = self._queued
        with self._applied_changed:
            return self._applied_changed.wait_for(lambda: self._applied >= target, timeout_s)

    def counters_dict(self) -> dict[str, Any]:
        """The figures for `stats_snapshot()` and the metrics (empty before shadow mode)."""
        if not self.starts:
            return {}
        c = self.counters
        out: dict[str, Any] = {
            "shadow_active": self.active,
            "shadow_starts": self.starts,
            "shadow_requests": c.requests,
            "shadow_queries": c.queries,
            "shadow_events_pending": max(0, self._queued - self._applied),
            "shadow_errors": self.errors,
            "shadow_overflows": self.overflows,
        }
        for name in CACHES:
            out[f"shadow_{name}_hits"] = c.hits[name]
            out[f"shadow_{name}_hit_requests"] = c.hit_requests[name]
            out[f"shadow_{name}_hit_ratio"] = c.hit_ratio(name)
            out[f"shadow_{name}_allocation_failures"] = c.allocation_failures[name]
            out[f"shadow_{name}_evictions"] = c.evictions[name]
        return out

    def close(self, timeout_s: float = 5.0) -> None:
        if self._worker is not None:
            self._queue.put(("close", None))
            self._worker.join(timeout=timeout_s)
            self._worker = None
