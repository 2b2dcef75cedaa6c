"""Shadow mode without vLLM: the feed, its background thread, and its figures against our replay.

Stand-ins carry the fields of vLLM's `Request` and `BlockPool` the shadow reads; their block
hashes are chained with MD5 over token tuples, unlike `lpc.blocks.hashing`, so the comparison
with `lpc.replay.shadow` (which hashes the tokens itself) checks the shadow on hashes it did
not make. The scheduler-run counterpart is test_vllm_scheduler.py.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from eviction import Release
from lpc.integrations.config import PluginConfig
from lpc.integrations.kill_switch import ModeSwitch
from lpc.integrations.shadow import Admission, Finish, ShadowFeed, Start
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_queue import QueueRuntime
from lpc.replay.shadow import ShadowRequest, learned_evictor_factory, replay_shadow

BLOCK = 4


def engine_hashes(tokens: list[int]) -> list[bytes]:
    out, parent = [], b""
    for i in range(len(tokens) // BLOCK):
        parent = hashlib.md5(parent + repr(tuple(tokens[i * BLOCK : (i + 1) * BLOCK])).encode())
        parent = parent.digest()
        out.append(parent)
    return out


@dataclass
class Request:
    request_id: str
    tokens: list[int]  # prompt, then the output it will emit
    num_prompt_tokens: int
    num_tokens: int = 0
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    finished: bool = False
    block_hashes: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.emit(self.num_prompt_tokens)

    def emit(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens
        self.block_hashes = engine_hashes(self.tokens[:num_tokens])

    def is_finished(self) -> bool:
        return self.finished


@dataclass
class Pool:
    num_gpu_blocks: int
    hash_block_size: int = BLOCK


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def make_feed(mode: str = "shadow", evictor: str = "lpc", **kwargs: Any):
    switch = ModeSwitch(mode)
    stats = PluginStats()
    queues = QueueRuntime(PluginConfig(evictor=evictor), stats)
    clock = Clock()
    feed = ShadowFeed(switch, stats, queues.new_evictor, clock, evictor, **kwargs)
    feed.events = []
    return feed, switch, stats, clock


def of(conversation: str | None):
    """A `conversation_of` that knows one answer."""
    return lambda request: conversation


def as_log(events: list[Any]) -> list[dict[str, Any]]:
    """The events as the scheduler replay writes them."""
    out = []
    for e in events:
        if isinstance(e, Start):
            out.append({"event": "start", "num_blocks": e.num_blocks, "block_size": e.block_size})
        elif isinstance(e, Admission):
            out.append(
                {
                    "event": "admit",
                    "request_id": e.request_id,
                    "conversation_id": e.conversation_id,
                    "t": e.time_s,
                    "tokens": e.num_tokens,
                }
            )
        else:
            assert isinstance(e, Finish)
            out.append(
                {
                    "event": "finish",
                    "request_id": e.request_id,
                    "t": e.time_s,
                    "p": e.probability,
                    "tokens": e.num_tokens,
                }
            )
    return out


def serve(feed: ShadowFeed, clock: Clock, pool: Pool, seed: int, turns: int = 300):
    """Multi-turn chats (each prompt repeats the conversation so far), several running at once,
    some preempted and rescheduled before they finish."""
    rng = random.Random(seed)
    history: dict[str, list[int]] = {}
    running: list[tuple[Request, str]] = []
    requests: dict[str, Request] = {}
    next_token = 1
    for index in range(turns):
        conversation = f"c{rng.randrange(12)}"
        new = list(range(next_token, next_token + rng.randint(3, 14)))
        output = list(range(next_token + 100_000, next_token + 100_000 + rng.randint(1, 9)))
        next_token += 20
        prompt = history.get(conversation, []) + new
        request = Request(f"r{index}", prompt + output, len(prompt))
        requests[request.request_id] = request
        feed.scheduled(request, pool, of(conversation))
        request.num_computed_tokens = request.num_prompt_tokens
        feed.scheduled(request, pool, of(conversation))  # a decode step: no second admission
        running.append((request, conversation))
        while len(running) > 4 or (running and rng.random() < 0.3):
            request, conversation = running.pop(rng.randrange(len(running)))
            if rng.random() < 0.1:  # preempted: freed unfinished, scheduled again later
                feed.finished(request, Release(clock(), None, conversation))
                request.num_preemptions += 1
                request.num_computed_tokens = 0
                feed.scheduled(request, pool, of(conversation))
                request.num_computed_tokens = request.num_prompt_tokens
            request.emit(len(request.tokens))
            request.num_computed_tokens = len(request.tokens) - 1  # the last token is sampled
            request.finished = True
            p = rng.choice([None, rng.random()])
            feed.finished(request, Release(clock(), p, conversation))
            history[conversation] = list(request.tokens)
    return requests


@pytest.mark.parametrize("evictor", ["lpc", "lpc-pooled"])
@pytest.mark.parametrize("seed", range(3))
def test_the_shadow_equals_our_replay_of_the_same_requests(evictor: str, seed: int) -> None:
    feed, _, stats, clock = make_feed(evictor=evictor)
    pool = Pool(num_gpu_blocks=40)
    try:
        requests = serve(feed, clock, pool, seed)
        assert feed.drain(30)
    finally:
        feed.close()
    snapshot = feed.counters_dict()
    ours = replay_shadow(
        {rid: ShadowRequest(r.tokens, r.num_prompt_tokens) for rid, r in requests.items()},
        as_log(feed.events),
        learned_evictor_factory(evictor, 1e-2, 0.5, 1e-6, 180.0 if evictor != "lpc" else None),
    )
    assert snapshot["shadow_requests"] == ours.requests == 300
    assert snapshot["shadow_queries"] == ours.queries
    for cache in ("lpc", "lru"):
        assert snapshot[f"shadow_{cache}_hits"] == ours.hits[cache] > 0
        assert snapshot[f"shadow_{cache}_hit_ratio"] == ours.hit_ratio(cache)
        assert snapshot[f"shadow_{cache}_allocation_failures"] == ours.allocation_failures[cache]
    if evictor == "lpc":  # lpc-pooled keys at the fallback p until its gate judged 100 releases
        assert snapshot["shadow_lpc_hits"] != snapshot["shadow_lru_hits"], "no difference"
    assert snapshot["shadow_errors"] == 0 and stats.plugin_errors == 0
    assert snapshot["shadow_events_pending"] == 0


def test_only_first_schedulings_enter_and_only_finishes_leave() -> None:
    feed, _, _, clock = make_feed()
    pool = Pool(num_gpu_blocks=20)
    try:
        running = Request("early", list(range(1, 13)), 8)
        running.num_computed_tokens = 8  # it was running before the shadow started
        feed.scheduled(running, pool, of(None))
        request = Request("r", list(range(1, 13)), 8)
        feed.scheduled(request, pool, of("c"))
        request.num_computed_tokens = 8
        feed.finished(request, Release(clock(), 0.9, "c"))  # preempted: not finished
        request.num_preemptions, request.num_computed_tokens = 1, 0
        feed.scheduled(request, pool, of("c"))  # rescheduled: no second admission
        request.emit(12)
        request.finished, request.num_computed_tokens = True, 11
        feed.finished(request, Release(clock(), 0.9, "c"))
        running.finished = True
        feed.finished(running, Release(clock(), 0.9, None))
        assert feed.drain(10)
    finally:
        feed.close()
    kinds = [type(e).__name__ for e in feed.events]
    assert kinds == ["Start", "Admission", "Finish"]
    admission, finish = feed.events[1], feed.events[2]
    assert (admission.request_id, admission.conversation_id, admission.num_tokens) == ("r", "c", 8)
    assert len(admission.block_hashes) == 2
    assert (finish.num_tokens, finish.probability, len(finish.block_hashes)) == (11, 0.9, 2)
    assert feed.counters_dict()["shadow_requests"] == 1


def test_leaving_shadow_mode_stops_and_reentering_starts_fresh() -> None:
    feed, switch, _, clock = make_feed(mode="lpc")
    pool = Pool(num_gpu_blocks=20)
    try:
        feed.scheduled(Request("before", list(range(1, 9)), 8), pool, of(None))
        assert feed.counters_dict() == {}, "nothing is exported before shadow mode"
        switch.set("shadow", "test")
        for i in range(2):
            request = Request(f"a{i}", list(range(1, 13)), 8)
            feed.scheduled(request, pool, of("c"))
            request.finished, request.num_computed_tokens = True, 11
            feed.finished(request, Release(clock(), 0.5, "c"))
        assert feed.drain(10)
        first = feed.counters_dict()
        assert first["shadow_requests"] == 2 and first["shadow_lru_hits"] == 4
        switch.set("lru", "test")
        feed.scheduled(Request("b", list(range(1, 13)), 8), pool, of("c"))
        assert feed.drain(10)
        stopped = feed.counters_dict()
        assert not stopped["shadow_active"] and stopped["shadow_requests"] == 2, "frozen"
        switch.set("shadow", "test")
        feed.scheduled(Request("c", list(range(1, 13)), 8), pool, of("c"))
        assert feed.drain(10)
        again = feed.counters_dict()
    finally:
        feed.close()
    assert again["shadow_starts"] == 2 and again["shadow_active"]
    assert (again["shadow_requests"], again["shadow_lru_hits"]) == (1, 0), "fresh caches"


def test_an_unreadable_request_costs_the_shadow_not_the_engine() -> None:
    feed, _, stats, clock = make_feed()
    try:
        feed.scheduled(object(), Pool(num_gpu_blocks=20), of(None))  # no request fields at all
        feed.finished(object(), Release(clock(), None, None))
        assert feed.drain(10)
    finally:
        feed.close()
    assert feed.counters_dict()["shadow_errors"] == 2 and stats.plugin_errors == 2


def test_a_shadow_that_falls_behind_stops_until_shadow_mode_is_entered_again() -> None:
    feed, switch, _, _ = make_feed(max_backlog=0)
    pool = Pool(num_gpu_blocks=20)
    try:
        feed.scheduled(Request("a", list(range(1, 9)), 8), pool, of(None))
        assert feed.drain(10)
        assert not feed.active and feed.overflows == 1
        feed.scheduled(Request("b", list(range(1, 9)), 8), pool, of(None))
        assert not feed.active, "it stays stopped while the mode stays shadow"
        switch.set("lpc", "test")
        feed.scheduled(Request("c", list(range(1, 9)), 8), pool, of(None))
        feed.max_backlog = 1000
        switch.set("shadow", "test")
        feed.scheduled(Request("d", list(range(1, 9)), 8), pool, of(None))
        assert feed.drain(10)
    finally:
        feed.close()
    assert feed.active and feed.counters_dict()["shadow_requests"] == 1


@dataclass
class Params:
    extra_args: dict[str, Any] | None = None


def test_the_plugins_hooks_feed_the_shadow(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first scheduling admits, a free finishes, `stats_snapshot()` and `set_mode` see it:
    the scheduler class's own calls (`scheduler_lpc`) around a stand-in manager."""
    from lpc.integrations import vllm_plugin
    from lpc.integrations.scheduler_lpc import LPCSchedulerQueue, ManagerLPC, SchedulerLPC
    from lpc.integrations.stock_queue import StockFreeBlockQueue

    config = PluginConfig(evictor="lpc", mode="shadow", stats_log_interval_s=0.0)
    runtime = vllm_plugin.build_runtime(config, clock=Clock())
    monkeypatch.setattr(vllm_plugin, "_REGISTRATION", vllm_plugin._Registration(runtime))
    assert runtime.shadow is not None
    runtime.shadow.events = []

    class BlockStandIn:
        def __init__(self, block_id: int) -> None:
            self.block_id, self.block_hash, self.block_hash_num_tokens = block_id, None, None
            self.pool = None

    blocks = [BlockStandIn(i) for i in range(20)]
    queue = LPCSchedulerQueue(blocks, 16, runtime, StockFreeBlockQueue)
    pool = Pool(num_gpu_blocks=20)
    pool.free_block_queue = queue  # type: ignore[attr-defined]

    class _Manager:
        block_pool = pool

        def __init__(self) -> None:
            self.coordinator = self

        def get_blocks(self, request_id: str) -> tuple[list[Any], ...]:
            return ([],)

        def free(self, request: Any) -> None:
            return None

    manager = ManagerLPC(SchedulerLPC(runtime, queue, pool), _Manager())
    try:
        for turn in range(2):
            request = Request(f"r{turn}", list(range(1, 21)), 12 if turn == 0 else 16)
            request.sampling_params = Params({"lpc_conversation_id": "conv"})  # type: ignore[attr-defined]
            manager.admitted(request, 0)
            request.emit(20)
            request.finished, request.num_computed_tokens = True, 19
            manager.free(request)
        assert vllm_plugin.drain_shadow(10)
        snapshot = vllm_plugin.stats_snapshot()
        admission = runtime.shadow.events[1]
        assert isinstance(admission, Admission) and admission.conversation_id == "conv"
        assert vllm_plugin.set_mode("lpc") and not vllm_plugin.set_mode("lpc")
        after = vllm_plugin.stats_snapshot()
    finally:
        runtime.shadow.close()
    assert snapshot["mode"] == "shadow" and snapshot["shadow_active"]
    assert (snapshot["shadow_requests"], snapshot["shadow_queries"]) == (2, 28)
    assert snapshot["shadow_lpc_hits"] == snapshot["shadow_lru_hits"] == 12
    assert (after["mode"], after["mode_switches"]) == ("lpc", 1)


def test_the_replays_evictor_keeps_the_plugins_pooled_memory() -> None:
    """The shadow's check replays with the memory the plugin ran (its config's), not a default."""
    default = learned_evictor_factory("lpc-pooled", 1e-2, 0.5, 1e-6, 180.0)(8)
    assert default.memory == PluginConfig().pooled_memory == "chains"
    for memory in ("content", "blocks"):
        built = learned_evictor_factory("lpc-pooled", 1e-2, 0.5, 1e-6, 180.0, memory)(8)
        assert built.memory == memory
