"""Fault injection: bad probabilities and failing plugin code never stop the engine.

A small stand-in for vLLM's `KVCacheManager` and `BlockPool` runs LPC as the LPC scheduler
class runs it on vLLM's (`scheduler_lpc`: the class's queue on the pool, each free through the
class's free path, each allocation told as a first scheduling) and drives the LPC free queue:
multi-turn requests sharing a system-prompt block, prefix hits, releases on a step clock. Into
every path a probability takes to the evictor — a request's `lpc_probability`, a predictor
answer, the in-process access model — go NaN, ±inf and values outside [0, 1]; the model, the
request log and the evictor raise; a promoted model is garbage; the conversation table is
full. At every step the engine-facing calls return and every block is either free or held,
and the evictor's invariants hold (checked every `INVARIANTS_EVERY` steps and at the end); bad
values count in `invalid_probabilities`, caught exceptions in `plugin_errors`. With `lpc`, a
bad p gives exactly the eviction order of the fallback p. The real-vLLM counterparts are
test_vllm_plugin.py and test_vllm_scheduler_class.py.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eviction import Release
from lpc.integrations import vllm_plugin
from lpc.integrations.access_runtime import AccessRuntime, LoadedModel, load_access_runtime
from lpc.integrations.config import PluginConfig, PluginConfigError
from lpc.integrations.conversation_table import ConversationTable
from lpc.integrations.predictions import PredictionBoard
from lpc.integrations.scheduler_lpc import LPCSchedulerQueue, ManagerLPC, SchedulerLPC
from lpc.integrations.stats import PluginStats
from lpc.integrations.stock_queue import StockFreeBlockQueue
from lpc.integrations.vllm_plugin import PluginRuntime
from lpc.integrations.vllm_queue import LPCFreeBlockQueue, QueueRuntime, bind_queue_class
from predictor.access_features import ConversationState, RequestState
from tests.integrations.access_models import SHIPPED, publish

NAN, INF = float("nan"), float("inf")
FALLBACK_P = 0.5
NUM_BLOCKS = 40
# As tests/properties.py's CHECK_EVERY (not imported: engine venvs may lack Hypothesis).
INVARIANTS_EVERY = 10
BAD_VALUES = {"nan": NAN, "inf": INF, "minus-inf": -INF, "above-one": 1.5, "negative": -0.2}


# -- a stand-in engine, LPC on it as the scheduler class runs it ----------------------------
@dataclass(eq=False)
class Block:
    """The fields of vLLM's `KVCacheBlock` the plugin reads."""

    block_id: int
    block_hash: bytes | None = None
    block_hash_num_tokens: int | None = None
    ref_cnt: int = 0
    is_null: bool = False
    pool: Any = None


@dataclass
class Params:
    extra_args: dict[str, Any] | None = None


@dataclass
class Request:
    """The fields of vLLM's `Request` the plugin and the access model read."""

    request_id: str
    index: int
    extra_args: dict[str, Any]
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2, 3])
    output_token_ids: list[int] = field(default_factory=lambda: [4, 5])

    def __post_init__(self) -> None:
        self.sampling_params = Params(self.extra_args)
        self.arrival_time = float(self.index)  # the fake model reads the index from it

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def is_finished(self) -> bool:
        return True


class _Pool:
    """vLLM's `BlockPool.free_blocks`: a block whose count drops to zero goes back to the free
    queue (cached ones appended, the others prepended)."""

    def __init__(self, queue: LPCFreeBlockQueue) -> None:
        self.free_block_queue = queue

    def free_blocks(self, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        for block in blocks:
            block.ref_cnt -= 1
        freed = [block for block in blocks if block.ref_cnt == 0]
        self.free_block_queue.append_n([b for b in freed if b.block_hash is not None])
        self.free_block_queue.prepend_n([b for b in freed if b.block_hash is None])


class _Manager:
    """vLLM's `KVCacheManager`: a request's blocks, prefix hits by block hash, free."""

    def __init__(self, pool: Any) -> None:
        self.block_pool = pool
        self.tables: dict[str, list[Block]] = {}
        self.cached: dict[bytes, Block] = {}
        self.hits = 0
        self.coordinator = self  # vLLM's coordinator: a request's blocks, per KV cache group

    def get_blocks(self, request_id: str) -> tuple[list[Block], ...]:
        return (self.tables[request_id],)

    def allocate_slots(self, request: Request, hashes: Sequence[bytes]) -> list[Block]:
        queue = self.block_pool.free_block_queue
        table = []
        for depth, block_hash in enumerate(hashes):
            block = self.cached.get(block_hash)
            if block is not None:
                if block.ref_cnt == 0:
                    queue.remove(block)
                self.hits += 1
            else:
                block = queue.popleft()
                if block.block_hash is not None:  # evicted: its content is gone
                    del self.cached[block.block_hash]
                block.block_hash, block.block_hash_num_tokens = block_hash, 16 * (depth + 1)
                self.cached[block_hash] = block
            block.ref_cnt += 1
            table.append(block)
        self.tables[request.request_id] = table
        return table

    def free(self, request: Request) -> None:
        self.block_pool.free_blocks(reversed(self.tables.pop(request.request_id)))


class Engine:
    """The stand-in manager with LPC on its pool, driven as the LPC scheduler class drives
    vLLM's (`scheduler_lpc.ManagerLPC`): each free through the class's free path (the release
    announced to the queue, then the manager's free), each allocation's hits told as a first
    scheduling is (`admitted`)."""

    def __init__(self, runtime: PluginRuntime, blocks: list[Block]) -> None:
        queue = LPCSchedulerQueue(blocks, 16, runtime, StockFreeBlockQueue)
        self.manager = _Manager(_Pool(queue))
        self.block_pool = self.manager.block_pool
        self.lpc = ManagerLPC(SchedulerLPC(runtime, queue, self.block_pool), self.manager)

    @property
    def hits(self) -> int:
        return self.manager.hits

    def allocate_slots(self, request: Request, hashes: Sequence[bytes]) -> list[Block]:
        before = self.manager.hits
        table = self.manager.allocate_slots(request, hashes)
        self.lpc.admitted(request, 16 * (self.manager.hits - before))
        return table

    def free(self, request: Request) -> None:
        self.lpc.free(request)


class StepClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def good_p(index: int) -> float:
    return ((index * 37) % 97 + 1) / 100.0


def is_bad(index: int) -> bool:
    return index % 4 == 1


@dataclass
class Run:
    orders: list[list[int]]  # the free queue's order after every step
    stats: dict[str, Any]
    hits: int
    runtime: PluginRuntime


def make_runtime(
    evictor: str = "lpc",
    clock: StepClock | None = None,
    client: Any = None,
    **config: Any,
) -> PluginRuntime:
    config.setdefault("trust_request_hints", True)  # requests carry p as a trusted API sets it
    config = PluginConfig(
        evictor=evictor, fallback_probability=FALLBACK_P, stats_log_interval_s=0.0, **config
    )
    stats = PluginStats()
    clock = clock or StepClock()
    queues = QueueRuntime(config, stats, clock)
    board = PredictionBoard(client, stats) if client is not None else None
    runtime = PluginRuntime(config, stats, queues, client, board)
    runtime.wall_clock = clock
    return runtime


def run_engine(
    runtime: PluginRuntime,
    extra_args: Callable[[int, str], dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    steps: int = 400,
    seed: int = 3,
    between: Callable[[int], None] | None = None,
) -> Run:
    """Requests of eight conversations (a shared system block, then the conversation's turns)
    allocated and freed through the wrapped engine; checks that no block is lost and records
    the free order at every step, the evictor's invariants every `INVARIANTS_EVERY` steps."""
    # Registered as the scheduler class registers its runtime: `stats_snapshot()` reads it.
    monkeypatch.setattr(vllm_plugin, "_REGISTRATION", vllm_plugin._Registration(runtime))
    clock = runtime.queues.clock
    blocks = [Block(i) for i in range(NUM_BLOCKS)]
    manager = Engine(runtime, blocks)
    queue = manager.block_pool.free_block_queue
    rng = random.Random(seed)
    turns: dict[str, int] = {}
    active: list[Request] = []
    orders = []
    index = 0
    for step in range(steps):
        clock.now += 1.0 + rng.random()
        if between is not None:
            between(step)
        if len(active) < 4 and (not active or rng.random() < 0.55):
            conversation = f"c{rng.randrange(8)}"
            turn = turns[conversation] = turns.get(conversation, 0) + 1
            hashes = [b"system"] + [f"{conversation}-{k}".encode() for k in range(min(turn, 5))]
            request = Request(f"r{index}", index, extra_args(index, conversation))
            index += 1
            manager.allocate_slots(request, hashes)
            active.append(request)
            if runtime.board is not None:  # one prediction per batch: the order is fixed
                deadline = time.monotonic() + 10
                while runtime.board.in_flight:
                    assert time.monotonic() < deadline, "prediction worker stuck"
                    time.sleep(0.0005)
        else:
            manager.free(active.pop(rng.randrange(len(active))))
        if step % INVARIANTS_EVERY == INVARIANTS_EVERY - 1:
            queue.evictor.check_invariants()
        held = sum(1 for block in blocks if block.ref_cnt > 0)
        assert queue.num_free_blocks + held == NUM_BLOCKS, "a block was lost"
        orders.append([block.block_id for block in queue.get_all_free_blocks()])
    for request in active:
        manager.free(request)
    queue.evictor.check_invariants()
    assert queue.num_free_blocks == NUM_BLOCKS
    if runtime.board is not None:
        runtime.board.close()
    return Run(orders, runtime.stats.snapshot(), manager.hits, runtime)


# -- the three sources of p, with bad values ----------------------------------------------------
class FakeModel:
    """An access model whose p for request i is `answer(i)` (raising if that raises)."""

    feature_names: tuple[str, ...] = ()
    horizon_s = 180.0

    def __init__(self, answer: Callable[[int], float]) -> None:
        self.answer = answer
        self.metadata = type("Metadata", (), {"base_rate": FALLBACK_P})()

    def predict_one(self, request: RequestState, conversation: ConversationState) -> float:
        return self.answer(int(request.arrival_s))


def with_model(runtime: PluginRuntime, answer: Callable[[int], float]) -> PluginRuntime:
    table = ConversationTable(100, 3600.0, 10**6)
    model = LoadedModel(FakeModel(answer), ("fake", 0, 0), False)  # type: ignore[arg-type]
    runtime.access = AccessRuntime(Path("fake"), model, table, runtime.stats, 0.0)
    return runtime


class FakeClient:
    """The predictor RPC client: the p of an item is `answer(i)` for its request i."""

    def __init__(self, answer: Callable[[int], Any]) -> None:
        self.answer = answer

    def predict(self, items: Sequence[Mapping[str, Any]]) -> list[Any] | None:
        answers = [self.answer(int(item["user_prompts"][0])) for item in items]
        return None if any(a is None for a in answers) else answers


# The bad-p runs and their references: 250 steps give them 600+ prefix hits, 30+ bad p and
# evictions (the free order, compared at every step, is the eviction order).
SOURCE_STEPS = 250


def source_run(source: str, bad: Any, monkeypatch: pytest.MonkeyPatch, evictor: str = "lpc") -> Run:
    """Run the engine with p from `source`; request i with `is_bad(i)` gets `bad` (a value, or
    an exception to raise), the others a good p."""

    def value(i: int) -> Any:
        if not is_bad(i):
            return good_p(i)
        if isinstance(bad, BaseException):
            raise bad
        return bad

    if source == "client":
        return run_engine(
            make_runtime(evictor),
            lambda i, c: {"lpc_conversation_id": c, "lpc_probability": value(i)},
            monkeypatch,
            steps=SOURCE_STEPS,
        )
    if source == "predictor":
        runtime = make_runtime(evictor, client=FakeClient(value))
        return run_engine(
            runtime,
            lambda i, c: {"lpc_conversation_id": c, "lpc_user_prompts": [str(i)]},
            monkeypatch,
            steps=SOURCE_STEPS,
        )
    assert source == "model"
    runtime = with_model(make_runtime(evictor), value)
    return run_engine(
        runtime, lambda i, c: {"lpc_conversation_id": c}, monkeypatch, steps=SOURCE_STEPS
    )


# What the reference run gives the bad requests: the fallback itself, however the source
# expresses it (no field; a failed predictor call; the fallback value from the model).
REFERENCE = {"client": None, "predictor": None, "model": FALLBACK_P}


def reference_run(source: str, monkeypatch: pytest.MonkeyPatch) -> Run:
    if source == "client":
        return run_engine(
            make_runtime(),
            lambda i, c: (
                {"lpc_conversation_id": c} | ({} if is_bad(i) else {"lpc_probability": good_p(i)})
            ),
            monkeypatch,
            steps=SOURCE_STEPS,
        )
    return source_run(source, REFERENCE[source], monkeypatch)


@pytest.fixture(scope="module")
def references() -> Callable[[str], Run]:
    """`reference_run` of a source, run once: the faulty runs of every bad value (and of the
    raising model) are compared with the same fallback run of their source."""
    runs: dict[str, Run] = {}

    def reference(source: str) -> Run:
        if source not in runs:
            with pytest.MonkeyPatch.context() as monkeypatch:
                runs[source] = reference_run(source, monkeypatch)
        return runs[source]

    return reference


@pytest.mark.parametrize("source", ["client", "predictor", "model"])
@pytest.mark.parametrize("bad", list(BAD_VALUES), ids=list(BAD_VALUES))
def test_a_bad_probability_evicts_exactly_as_the_fallback(
    source: str, bad: str, monkeypatch: pytest.MonkeyPatch, references: Callable[[str], Run]
) -> None:
    faulty = source_run(source, BAD_VALUES[bad], monkeypatch)
    reference = references(source)
    assert faulty.hits > 50, "the workload must hit the cache"
    assert faulty.orders == reference.orders, "a bad p did not evict as the fallback p"
    s = faulty.stats
    bad_requests = sum(1 for i in range(s["releases"]) if is_bad(i))
    assert s["invalid_probabilities"] == bad_requests > 0
    assert s["fallbacks_used"] == bad_requests and s["plugin_errors"] == 0
    if source == "client":
        assert s["invalid_hints"] == bad_requests
    if source == "predictor":
        assert s["predictor_failures"] == bad_requests
    if source == "model":
        assert s["predictions_in_process"] == s["releases"] - bad_requests


@pytest.mark.parametrize("source", ["client", "predictor", "model"])
def test_the_pooled_evictor_stays_valid_under_bad_probabilities(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = source_run(source, NAN, monkeypatch, evictor="lpc-pooled")
    assert run.stats["invalid_probabilities"] > 0 and run.stats["plugin_errors"] == 0
    assert run.stats["shared_blocks_released"] > 0, "the system block must be shared"


def test_a_raising_model_falls_back_and_keeps_the_history(
    monkeypatch: pytest.MonkeyPatch, references: Callable[[str], Run]
) -> None:
    faulty = source_run("model", RuntimeError("model broke"), monkeypatch)
    reference = references("model")
    assert faulty.orders == reference.orders
    s = faulty.stats
    assert s["access_prediction_errors"] == s["fallbacks_used"] > 0
    assert s["invalid_probabilities"] == 0 and s["plugin_errors"] == 0
    # The failed releases were still recorded: every conversation's history is complete.
    table = faulty.runtime.access.table  # type: ignore[union-attr]
    assert sum(e.state.requests_so_far for e in table.entries.values()) == s["releases"]


def test_one_bad_value_discredits_the_predictors_whole_answer() -> None:
    """[NaN, 0.5] for two requests sent together: both get the fallback p (the answer is
    suspect as a whole), the NaN counts as an invalid probability, the call as failed."""
    stats = PluginStats()
    gate, entered = threading.Event(), threading.Event()
    answers = iter([[0.25], [NAN, 0.5]])

    class Client:
        def predict(self, items: Sequence[Mapping[str, Any]]) -> list[float]:
            entered.set()
            assert gate.wait(30)
            return next(answers)

    board = PredictionBoard(Client(), stats)
    board.ask("first", {"x": 1})
    assert entered.wait(10)
    board.ask("a", {"x": 2})  # queued behind the first call: one batch of two
    board.ask("b", {"x": 3})
    gate.set()
    deadline = time.monotonic() + 10
    while board.in_flight:
        assert time.monotonic() < deadline, "prediction worker stuck"
        time.sleep(0.0005)
    assert [board.take(r) for r in ("first", "a", "b")] == [0.25, None, None]
    assert stats.invalid_probabilities == 1 and stats.predictor_failures == 1
    board.close()


# -- exceptions inside the plugin's hooks -------------------------------------------------------
class FailingLog:
    """A request log whose every call raises (a disk, a bug): the log is not the engine."""

    def __init__(self) -> None:
        self.calls = 0  # finished requests
        self.noted = 0  # prefix hits noted at a first scheduling

    def finished(self, *args: Any) -> None:
        self.calls += 1
        raise OSError("log broke")

    def note_computed(self, *args: Any) -> None:
        self.noted += 1
        raise OSError("log broke")

    def summary(self) -> str:
        raise OSError("log broke")

    def counters(self) -> dict[str, int]:
        return {}


def test_a_failing_request_log_changes_nothing_and_is_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = make_runtime()
    runtime.request_log = FailingLog()  # type: ignore[assignment]
    extra = lambda i, c: {"lpc_conversation_id": c, "lpc_probability": good_p(i)}  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.lpc"):
        faulty = run_engine(runtime, extra, monkeypatch)
    reference = run_engine(make_runtime(), extra, monkeypatch)
    assert faulty.orders == reference.orders
    log = runtime.request_log
    assert log.calls == faulty.stats["releases"] and log.noted == log.calls
    assert faulty.stats["plugin_errors"] == log.calls + log.noted
    errors = [r for r in caplog.records if "the request log failed" in r.getMessage()]
    assert len(errors) == 1, "an error that recurs is logged once, not at every call"


def test_an_evictor_that_raises_falls_back_to_lru_places(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The evictor's push raising (before it changed anything) for one release in three: the
    blocks are queued with the fallback p at the clock, the engine goes on, no block is lost."""
    runtime = make_runtime()
    real_new_evictor = runtime.queues.new_evictor
    failures = []

    def new_evictor(num_blocks: int) -> Any:
        evictor = real_new_evictor(num_blocks)
        push = evictor.push_cached

        def flaky_push(freed: Any, release: Release) -> None:
            if release.conversation_id is not None and len(failures) % 3 == 0:
                failures.append(release)
                raise ZeroDivisionError("evictor bug")
            if release.conversation_id is not None:
                failures.append(None)
            push(freed, release)

        evictor.push_cached = flaky_push  # type: ignore[method-assign]
        return evictor

    monkeypatch.setattr(runtime.queues, "new_evictor", new_evictor)
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.lpc"):
        run = run_engine(
            runtime,
            lambda i, c: {"lpc_conversation_id": c, "lpc_probability": good_p(i)},
            monkeypatch,
        )
    raised = sum(1 for f in failures if f is not None)
    assert raised > 10 and run.stats["plugin_errors"] == raised
    assert sum("the LPC queue's append failed" in r.getMessage() for r in caplog.records) == 1


def test_every_evictor_call_failing_still_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last resort: pushing cached blocks always fails (even on the fallback p), so the
    first such release trips the queue: its blocks, and every block after, go to vLLM's own
    list, the evictor is called no more; requests are still served and no block is lost."""
    runtime = make_runtime()
    real_new_evictor = runtime.queues.new_evictor

    def new_evictor(num_blocks: int) -> Any:
        evictor = real_new_evictor(num_blocks)

        def broken(*args: Any) -> None:
            raise RuntimeError("evictor broke")

        evictor.push_cached = broken  # type: ignore[method-assign]
        evictor.note_shared_release = broken  # type: ignore[method-assign]
        return evictor

    monkeypatch.setattr(runtime.queues, "new_evictor", new_evictor)
    run = run_engine(runtime, lambda i, c: {"lpc_conversation_id": c}, monkeypatch, steps=200)
    assert run.stats["releases"] > 50
    assert run.stats["plugin_errors"] == 2, "tripped at the first release: append, fallback"
    (queue,) = runtime.queues.mode.followers
    assert queue.phase == "through" and not len(queue.evictor)


def test_a_failing_release_path_gets_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything raising while the plugin works out a release (here: reading the hints) costs
    that release its prediction only."""
    runtime = make_runtime()
    real = runtime.hints_for
    calls = []

    def flaky_hints(request: Any) -> Any:
        calls.append(1)
        if len(calls) % 5 == 0:
            raise KeyError("hints broke")
        return real(request)

    monkeypatch.setattr(runtime, "hints_for", flaky_hints)
    run = run_engine(
        runtime,
        lambda i, c: {"lpc_conversation_id": c, "lpc_probability": good_p(i)},
        monkeypatch,
    )
    assert run.stats["plugin_errors"] == len(calls) // 5 > 0
    assert runtime.hints == {} and runtime.deferred_releases == {}


def test_asking_for_a_prediction_failing_costs_only_the_prediction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = make_runtime(client=FakeClient(good_p))
    monkeypatch.setattr(runtime.board, "ask", lambda *a: 1 / 0)
    run = run_engine(
        runtime, lambda i, c: {"lpc_conversation_id": c, "lpc_user_prompts": [str(i)]}, monkeypatch
    )
    assert run.stats["plugin_errors"] == run.stats["releases"]
    assert run.stats["fallbacks_used"] == run.stats["releases"]


def test_a_failing_metrics_server_does_not_stop_the_engine() -> None:
    stats = PluginStats()

    def activate() -> None:
        raise RuntimeError("LPC_METRICS_PORT is set but prometheus_client is not installed")

    runtime = QueueRuntime(PluginConfig(), stats, activate=activate)
    queue = bind_queue_class(runtime)([Block(0), Block(1)])
    assert queue.num_free_blocks == 2 and stats.plugin_errors == 1


# -- the in-process access model: reload faults and a full table -------------------------------
def shipped_runtime(registry: Path, **config: Any) -> PluginRuntime:
    runtime = make_runtime(access_model=str(registry), access_model_reload_s=1.0, **config)
    runtime.access = load_access_runtime(runtime.config, runtime.stats)
    return runtime


def garbage_metadata(folder: Path) -> None:
    (folder / "metadata.json").write_bytes(b"\x00garbage{")


def garbage_weights(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"not weights")


def nan_weights(folder: Path) -> None:
    """Loads and checks out (sizes, checksum), but every p it gives is NaN."""
    import hashlib

    from safetensors.numpy import load_file, save_file

    state = load_file(folder / "model.safetensors")
    last = max(k for k in state if k.endswith(".bias"))
    state[last] = np.full_like(state[last], np.nan)
    save_file(state, folder / "model.safetensors")
    data = (folder / "model.safetensors").read_bytes()
    meta = json.loads((folder / "metadata.json").read_text())
    meta["weights_sha256"] = hashlib.sha256(data).hexdigest()
    meta["weights_bytes"] = len(data)
    (folder / "metadata.json").write_text(json.dumps(meta))


def folder_becomes_a_file(folder: Path) -> None:
    shutil.rmtree(folder)
    folder.write_text("garbage")


@pytest.mark.parametrize(
    "corrupt",
    [garbage_metadata, garbage_weights, nan_weights, folder_becomes_a_file],
    ids=["metadata", "weights", "nan-weights", "file-not-folder"],
)
def test_a_corrupt_model_folder_keeps_the_old_model_serving(
    corrupt: Callable[[Path], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The configured artifact folder itself is overwritten with garbage while serving."""
    folder = tmp_path / "model"
    shutil.copytree(SHIPPED, folder)
    runtime = shipped_runtime(folder)
    access = runtime.access
    assert access is not None
    before = access.predictor

    def between(step: int) -> None:
        if step == 100:
            corrupt(folder)
        access.check_for_promoted_model()  # what the background thread does every reload_s

    run = run_engine(runtime, lambda i, c: {"lpc_conversation_id": c}, monkeypatch, between=between)
    s = run.stats
    assert access.predictor is before, "the old model must stay"
    assert s["access_model_reload_failures"] == 1, "counted once, not at every check"
    assert s["predictions_in_process"] == s["releases"] and s["fallbacks_used"] == 0
    assert s["plugin_errors"] == 0 and s["invalid_probabilities"] == 0


def test_a_registry_promoting_garbage_keeps_the_old_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    publish(registry, "v0001")
    runtime = shipped_runtime(registry)
    versions = iter(range(2, 100))

    def between(step: int) -> None:
        if step % 80 == 40:  # a promotion of garbage, now and then
            garbage_weights(publish(registry, f"v{next(versions):04d}"))
        runtime.access.check_for_promoted_model()  # type: ignore[union-attr]

    run = run_engine(runtime, lambda i, c: {"lpc_conversation_id": c}, monkeypatch, between=between)
    assert runtime.access is not None and runtime.access.pointer[0].endswith("v0001")
    assert run.stats["access_model_reload_failures"] == 5
    assert run.stats["predictions_in_process"] == run.stats["releases"]


def test_an_unforeseen_loader_error_is_a_reload_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    publish(registry, "v0001")
    runtime = shipped_runtime(registry)
    from lpc.integrations import access_runtime

    def loader_bug(folder: Any) -> Any:
        raise KeyError("a loader bug")

    monkeypatch.setattr(access_runtime.AccessPredictor, "load", loader_bug)

    def between(step: int) -> None:
        if step == 50:
            publish(registry, "v0002")
        runtime.access.check_for_promoted_model()  # type: ignore[union-attr]

    run = run_engine(runtime, lambda i, c: {"lpc_conversation_id": c}, monkeypatch, between=between)
    assert run.stats["access_model_reload_failures"] == 1
    assert run.stats["predictions_in_process"] == run.stats["releases"]


def test_a_model_giving_nan_is_refused_at_startup(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(SHIPPED, folder)
    nan_weights(folder)
    # The shared artifact check names the tensor; past it, the probe request's NaN would.
    refused = r"LPC_ACCESS_MODEL.*model\.safetensors tensor '[^']+' holds NaN or infinity"
    with pytest.raises(PluginConfigError, match=refused):
        load_access_runtime(PluginConfig(access_model=str(folder)), PluginStats())


def test_a_full_conversation_table_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table that holds two conversations and 8 tokens, for eight conversations: it evicts
    at almost every release, the model still predicts every release."""
    runtime = shipped_runtime(SHIPPED, conversation_table_size=2, conversation_table_max_tokens=8)
    run = run_engine(runtime, lambda i, c: {"lpc_conversation_id": c}, monkeypatch)
    table = runtime.access.table  # type: ignore[union-attr]
    assert len(table) <= 2 and table.stored_tokens <= 8
    assert table.evicted > run.stats["releases"] // 2
    assert run.stats["predictions_in_process"] == run.stats["releases"]
    assert run.stats["plugin_errors"] == 0


def test_a_table_that_cannot_record_costs_the_history_not_the_prediction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = shipped_runtime(SHIPPED)
    table = runtime.access.table  # type: ignore[union-attr]

    def out_of_memory(*args: Any) -> None:
        raise MemoryError("table full")

    monkeypatch.setattr(table, "finished", out_of_memory)
    run = run_engine(runtime, lambda i, c: {"lpc_conversation_id": c}, monkeypatch)
    assert run.stats["predictions_in_process"] == run.stats["releases"]
    assert run.stats["plugin_errors"] == run.stats["releases"]


# -- the SGLang strategy: a request's priority carries p -------------------------------------
@pytest.mark.parametrize("priority", [NAN, INF, -INF, -5, 5_000_000, "high"])
def test_a_priority_that_carries_no_p_gets_the_fallback(priority: Any) -> None:
    from eviction.lpc import static_key
    from lpc.integrations.sglang_strategy import LPCStrategy

    strategy = LPCStrategy(scale_per_s=0.01, fallback_probability=0.3)
    node = type("Node", (), {"priority": priority, "last_access_time": 50.0})()
    key = strategy.get_priority(node)
    assert key == static_key(0.3, 50.0, 0.01, 1e-6) and not math.isnan(key)
    assert strategy.invalid_priorities == 1
    for unset in (0, None):  # SGLang's "no priority": the fallback, not counted
        node.priority = unset
        assert strategy.get_priority(node) == key
    assert strategy.invalid_priorities == 1


def test_bad_priorities_in_a_radix_tree_evict_as_no_prediction() -> None:
    from lpc.integrations.sglang_strategy import LPCStrategy, probability_to_priority
    from tests.integrations.radix_standin import StandInRadixCache
    from tests.integrations.sglang_scenarios import EVERYTHING, Clock, conversation

    def evicted(bad: Any) -> tuple[list[int], LPCStrategy]:
        clock = Clock()
        strategy = LPCStrategy(fallback_probability=0.4)
        tree = StandInRadixCache(strategy, clock)
        for tag in range(24):
            clock.now += 1.0 + (tag * 7) % 5
            priority = bad if tag % 3 == 0 else probability_to_priority(good_p(tag))
            tree.insert(conversation(tag + 1), priority)
        return [node.key[0] for node in tree.evict(EVERYTHING)], strategy

    reference, _ = evicted(0)
    for bad in (NAN, INF, -1, 2_000_000):
        order, strategy = evicted(bad)
        assert order == reference and strategy.invalid_priorities > 0


def test_the_whole_free_path_is_timed_queue_work_included(monkeypatch: pytest.MonkeyPatch) -> None:
    """`lpc_free_seconds` times all of `KVCacheManager.free` (the plugin's release, vLLM's loop
    and the LPC queue's work), not only the plugin's part (`lpc_release_seconds`)."""
    run = run_engine(
        make_runtime(), lambda i, c: {"lpc_probability": good_p(i)}, monkeypatch, steps=120
    )
    histograms = run.runtime.queues.histograms.snapshot()
    free, release = histograms["free_seconds"], histograms["release_seconds"]
    assert free.count == release.count == run.stats["releases"] > 0  # one per freed request
    assert free.total > release.total  # the whole free holds the plugin's part and more
