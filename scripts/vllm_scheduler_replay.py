"""Serve a request trace with vLLM 0.33.0's own `Scheduler` on the CPU, on a simulated clock.

Runs INSIDE the vLLM venv (scripts/setup_vllm_venv.sh); `lpc vllm-ab` (the
project's venv, through `lpc.drivers.vllm_scheduler`) writes the requests and runs it once per
policy. No model and no GPU: the engine loop of `vllm.v1.engine.core.EngineCore.step` is
reproduced with a synthetic `ModelRunnerOutput`.

- The scheduler is `vllm.v1.core.sched.scheduler.Scheduler`, built as the engine core builds it
  (`SchedulerConfig.get_scheduler_cls()`, `resolve_kv_cache_block_sizes`, the block hasher of
  `cache_config.prefix_caching_hash_algo`), from a `VllmConfig` whose `ModelConfig` reads a
  local `config.json` written here (a Llama-shaped config of a stand-in architecture registered
  with `ModelRegistry.register_model`, never instantiated: nothing is downloaded or loaded).
  Chunked prefill is on, prefix caching on, FCFS, synchronous scheduling, vLLM's defaults for
  everything else; the token budget and the KV pool are the caller's.
- Plugins load as vLLM loads them: `vllm.plugins.load_general_plugins()`, which reads the
  `vllm.general_plugins` entry points allowed by `VLLM_PLUGINS`; loaded, the LPC plugin patches
  nothing. LPC then runs through `--scheduler-cls` (the LPC scheduler class) or through a
  vLLM's eviction-policy seam (`--eviction-policy`, its settings from the LPC_* variables).
  The caller sets `VLLM_PLUGINS=` (none) for stock vLLM and `VLLM_PLUGINS=lpc` for the plugin.
  Once registered, the plugin's clock (release times, and completion times for the access
  features) is pointed at the simulated clock.
- A request is added when the simulated clock passes its arrival (`Request.arrival_time` is
  the trace's arrival, on the same timeline). Each step runs `schedule()`, advances the clock
  by `step_base_s + step_per_token_s * scheduled tokens`, and feeds `update_from_output()` one
  sampled token per scheduled request whose prompt is complete after the step (a partial
  prefill chunk samples nothing, as vLLM's model runner discards it): the request's recorded
  output token, in order, so a next turn that repeats the output finds its blocks cached. A
  request stops after its recorded number of output tokens (`max_tokens`, `ignore_eos`).
  Releases inside the scheduler's calls read the clock strictly increasing (a microsecond per
  read), as a real clock advances between two frees; a preemption is released at the step's
  start, a finished request at its end.

With the plugin: `--switch-at STEP:MODE` switches its mode (lpc, lru, shadow) before the
step's `schedule()` (`vllm_plugin.set_mode`, as the control file does in a deployment); the
plugin's free queue is checked against stock vLLM's own `FreeKVCacheBlockQueue`, fed every
call the engine makes on it (`LRUOrderCheck`): in lru and shadow mode each eviction must be the
one stock vLLM makes from the same free blocks; `--shadow-events` writes the shadow caches'
event log (`lpc.replay.shadow` replays it).

Input: JSON lines sorted by arrival, `{"request_id", "conversation_id", "arrival_s", "prompt",
"output", "probability", "cache_salt"}`, token ids as runs `[start, length, start, length, ...]`
(consecutive ids compress: a Mooncake block is one run). Output: one JSON record per step
(`--records`) and a JSON summary (`--summary`, and the last line on stderr): totals, the
prefix-cache hits of vLLM's `SchedulerStats`, preemptions, recomputed tokens, chunked prefills,
the invariants checked at the end, the plugin's counters.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EXPECTED_VLLM_VERSION = "0.33.0"
STANDIN_ARCHITECTURE = "LPCSchedulerStandIn"
CLOCK_STEP_S = 1e-6  # the clock's advance per read within a step


class DriverError(RuntimeError):
    """The replay could not be carried out."""


class SimulatedClock:
    """The simulated time: `now` is set by the engine loop; each read returns at least `now`
    and strictly more than the previous read, as a real clock does between two calls."""

    def __init__(self) -> None:
        self.now = 0.0
        self._last = -math.inf

    def __call__(self) -> float:
        value = max(self.now, self._last + CLOCK_STEP_S)
        self._last = value
        return value


def expand_runs(runs: list[int]) -> list[int]:
    tokens: list[int] = []
    for i in range(0, len(runs), 2):
        start, length = runs[i], runs[i + 1]
        tokens.extend(range(start, start + length))
    return tokens


def read_requests(path: Path) -> Iterator[dict[str, Any]]:
    previous = -math.inf
    with path.open(encoding="utf-8") as lines:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if record["arrival_s"] < previous:
                raise DriverError(f"{path}:{lineno}: requests must be sorted by arrival")
            previous = record["arrival_s"]
            yield record


def write_model_config(folder: Path, max_model_len: int) -> None:
    """A small Llama-shaped config.json naming the stand-in architecture."""
    config = {
        "architectures": [STANDIN_ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": 32000,
        "max_position_embeddings": max_model_len,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")


def register_standin_architecture() -> None:
    """Register a model class vLLM can inspect (its interfaces) without importing any model
    module: the scheduler needs a `ModelConfig`, never the model."""
    from torch import nn
    from vllm import ModelRegistry

    class LPCSchedulerStandIn(nn.Module):
        def __init__(self, *, vllm_config: Any = None, prefix: str = "") -> None:
            raise RuntimeError("the scheduler replay never builds a model")

        def embed_input_ids(self, input_ids: Any) -> Any:
            raise NotImplementedError

        def forward(self, input_ids: Any, positions: Any) -> Any:
            raise NotImplementedError

        def compute_logits(self, hidden_states: Any) -> Any:
            raise NotImplementedError

    ModelRegistry.register_model(STANDIN_ARCHITECTURE, LPCSchedulerStandIn)


def load_plugins(clock: SimulatedClock) -> dict[str, Any]:
    """vLLM's own plugin loading (`VLLM_PLUGINS` decides), then the simulated clock for LPC."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    loaded: dict[str, Any] = {"vllm_plugins": os.environ.get("VLLM_PLUGINS")}
    loaded["lpc_imported"] = "lpc.integrations.vllm_plugin" in sys.modules
    if not loaded["lpc_imported"]:
        loaded["lpc"] = False
        return loaded
    from lpc.integrations import vllm_plugin

    loaded["lpc"] = vllm_plugin.is_registered()
    if loaded["lpc"]:
        # Registered through the seam (as vLLM calls it): its clocks are the process's.
        # The replay's time is simulated, so both read the simulated clock from here on; no
        # block pool exists yet, and nothing has been released.
        loaded["config"] = simulate_plugin_clock(clock)
    return loaded


def simulate_plugin_clock(clock: SimulatedClock) -> dict[str, Any]:
    """Point the registered plugin's clocks at the simulation (before any release); its
    configuration."""
    from lpc.integrations import vllm_plugin

    try:
        runtime = vllm_plugin._REGISTRATION.runtime
        runtime.queues.clock  # noqa: B018  (both attributes must exist before setting)
        runtime.wall_clock  # noqa: B018
    except AttributeError as error:
        raise DriverError(
            f"the LPC plugin's registration has no clock to point at the simulation "
            f"({error}); update simulate_plugin_clock() to the plugin's current runtime"
        ) from None
    runtime.queues.clock = clock
    runtime.wall_clock = clock
    return runtime.config.as_dict()


class LRUOrderCheck:
    """Stock vLLM's `FreeKVCacheBlockQueue` over stand-in blocks, fed every call the block pool
    makes on its free queue: the plugin's, or, off and drained in `lru`, the vLLM queue object
    the plugin handed the pool (both wrapped on their instance only, each counting the calls
    that reach it from the pool). While the plugin's queue passes every call to vLLM's (its
    phase `through`) each block it hands out must be the one this queue hands out; otherwise
    the plugin's choice is taken out of it, and counted when it differs from its front."""

    def __init__(self, pool: Any, queue: Any) -> None:
        from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

        self.pool = pool
        self.queue = queue
        self.standins = [KVCacheBlock(block_id=i) for i in range(len(queue._blocks))]
        # The pool took its null block already: the reference starts from the same free list.
        free = [self.standins[b.block_id] for b in queue.get_all_free_blocks()]
        self.reference = FreeKVCacheBlockQueue(free)
        self.counts = {"lru_pops": 0, "lru_mismatches": 0, "lpc_pops": 0, "lpc_not_lru": 0}
        self._inside = False
        for target in (queue, queue._list):
            for name in ("popleft", "popleft_n", "remove", "append", "append_n", "prepend_n"):
                original = getattr(target, name)
                wrapped = getattr(self, "_" + name)(original)
                setattr(target, name, self._from_pool(target, original, wrapped))

    def _from_pool(self, target: Any, original: Any, wrapped: Any) -> Any:
        """`wrapped` for the calls the pool makes on `target`, `original` for the plugin's
        queue's own calls on its list (made inside a call of the pool's, even when that call
        hands the pool the list half way: the end of a drain)."""

        def call(*args: Any) -> Any:
            if self._inside or self.pool.free_block_queue is not target:
                return original(*args)
            self._inside = True
            try:
                return wrapped(*args)
            finally:
                self._inside = False

        return call

    def _popleft(self, original: Any) -> Any:
        def popleft() -> Any:
            lru = self._vllm_s_own()
            block = original()
            self._popped([block.block_id], lru)
            return block

        return popleft

    def _popleft_n(self, original: Any) -> Any:
        def popleft_n(n: int) -> list[Any]:
            lru = self._vllm_s_own()
            blocks = original(n)
            self._popped([b.block_id for b in blocks], lru)
            return blocks

        return popleft_n

    def _vllm_s_own(self) -> bool:
        """Is the queue vLLM's own list now (off, its learned blocks drained: phase
        `through`)? Read before a pop: the pop that drains the last learned block changes it."""
        return self.queue.phase == "through"

    def _popped(self, ids: list[int], lru: bool) -> None:
        if not ids:
            return
        if lru:  # the mode this pop was made in
            expected = [b.block_id for b in self.reference.popleft_n(len(ids))]
            self.counts["lru_pops"] += len(ids)
            self.counts["lru_mismatches"] += sum(a != b for a, b in zip(ids, expected, strict=True))
            return
        front, node = [], self.reference.fake_free_list_head.next_free_block
        while len(front) < len(ids) and node is not self.reference.fake_free_list_tail:
            front.append(node.block_id)
            node = node.next_free_block
        self.counts["lpc_pops"] += len(ids)
        self.counts["lpc_not_lru"] += sum(a != b for a, b in zip(ids, front, strict=False))
        for block_id in ids:
            self.reference.remove(self.standins[block_id])

    def _remove(self, original: Any) -> Any:
        def remove(block: Any) -> None:
            original(block)
            self.reference.remove(self.standins[block.block_id])

        return remove

    def _append(self, original: Any) -> Any:
        def append(block: Any) -> None:
            original(block)
            self.reference.append(self.standins[block.block_id])

        return append

    def _append_n(self, original: Any) -> Any:
        def append_n(blocks: Any) -> None:
            original(blocks)
            self.reference.append_n([self.standins[b.block_id] for b in blocks])

        return append_n

    def _prepend_n(self, original: Any) -> Any:
        def prepend_n(blocks: Any) -> None:
            original(blocks)
            self.reference.prepend_n([self.standins[b.block_id] for b in blocks])

        return prepend_n


def parse_switches(text: str) -> dict[int, str]:
    """`STEP:MODE[,STEP:MODE...]` -> {step: mode}."""
    switches: dict[int, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        step, _, mode = item.partition(":")
        if not step.isdigit() or int(step) < 1 or mode not in ("lpc", "lru", "shadow"):
            raise DriverError(f"--switch-at: {item!r} is not STEP:MODE (lpc, lru or shadow)")
        switches[int(step)] = mode
    return switches


def build_scheduler(args: argparse.Namespace, model_dir: Path) -> tuple[Any, Any]:
    """The Scheduler, as `EngineCore.__init__` builds it, and the request block hasher."""
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import (
        get_request_block_hasher,
        init_none_hash,
        resolve_kv_cache_block_sizes,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    write_model_config(model_dir, args.max_model_len)
    register_standin_architecture()
    model_config = ModelConfig(
        model=str(model_dir),
        skip_tokenizer_init=True,
        max_model_len=args.max_model_len,
        dtype="float32",
        seed=0,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        async_scheduling=False,
        scheduler_cls=args.scheduler_cls,
    )
    cache_config = CacheConfig(block_size=args.block_size, enable_prefix_caching=True)
    if args.eviction_policy is not None:  # vLLM's eviction-policy seam (a patched vLLM)
        cache_config.eviction_policy = args.eviction_policy
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
        additional_config=json.loads(args.additional_config) if args.additional_config else {},
        # One rank of a data-parallel engine: each rank's engine core builds its own
        # scheduler and KV cache from this configuration (size 1: no data parallelism).
        parallel_config=ParallelConfig(
            data_parallel_size=args.data_parallel_size,
            data_parallel_rank=args.data_parallel_rank,
        ),
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=args.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer0"],
                FullAttentionSpec(
                    block_size=args.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    vllm_config.cache_config.num_gpu_blocks = args.num_blocks
    scheduler_cls = vllm_config.scheduler_config.get_scheduler_cls()
    if scheduler_cls is not Scheduler and not (
        args.scheduler_cls and issubclass(scheduler_cls, Scheduler)
    ):
        raise DriverError(f"vLLM chose {scheduler_cls.__qualname__}, not Scheduler")
    scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(
        kv_cache_config, vllm_config
    )
    scheduler = scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        include_finished_set=False,
        log_stats=True,
        block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
    )
    hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(
        hash_block_size, hash_fn, vllm_config.num_hash_lookahead_tokens
    )
    return scheduler, hasher


def pool_invariants(scheduler: Any) -> dict[str, Any]:
    """What must hold once every request has finished: no block leaked or freed twice."""
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    usable = pool.num_gpu_blocks - 1  # block 0 is the null block, never free
    queue_ids = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    cached = [b for b in pool.blocks if b.block_hash is not None]
    nonzero = [b.block_id for b in pool.blocks if not b.is_null and b.ref_cnt != 0]
    mapped = sum(
        1 for b in cached if pool.cached_block_hash_to_block.get_one_block(b.block_hash) is not None
    )
    held = {
        type(m).__name__: len(getattr(m, "req_to_blocks", {}))
        for m in manager.coordinator.single_type_managers
    }
    checks = {
        "free_blocks_equal_total": pool.get_num_free_blocks() == usable,
        "ref_counts_zero": not nonzero,
        "free_queue_holds_each_block_once": len(queue_ids) == usable
        and len(set(queue_ids)) == usable
        and pool.null_block.block_id not in queue_ids,
        "cached_blocks_in_hash_map": mapped == len(cached),
        "no_request_holds_blocks": all(n == 0 for n in held.values()),
        "scheduler_empty": not scheduler.requests
        and not scheduler.running
        and len(scheduler.waiting) == 0,
    }
    return {
        "ok": all(checks.values()),
        "checks": checks,
        "usable_blocks": usable,
        "free_blocks": pool.get_num_free_blocks(),
        "free_queue_length": len(queue_ids),
        "nonzero_ref_counts": nonzero[:20],
        "cached_blocks": len(cached),
        "queue": type(pool.free_block_queue).__name__,
    }


def held_blocks_consistent(scheduler: Any) -> str | None:
    """During the run: free blocks + blocks held by requests = every block, and each block's
    reference count is the number of requests holding it. None when it holds."""
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    holders: dict[int, int] = {}
    for single in manager.coordinator.single_type_managers:
        for blocks in single.req_to_blocks.values():
            for block in blocks:
                if not block.is_null:
                    holders[block.block_id] = holders.get(block.block_id, 0) + 1
    for block in pool.blocks:
        if block.is_null:
            continue
        if block.ref_cnt != holders.get(block.block_id, 0):
            return (
                f"block {block.block_id}: ref_cnt {block.ref_cnt}, held by "
                f"{holders.get(block.block_id, 0)} requests"
            )
    if pool.get_num_free_blocks() + len(holders) != pool.num_gpu_blocks - 1:
        return (
            f"{pool.get_num_free_blocks()} free + {len(holders)} held != "
            f"{pool.num_gpu_blocks - 1} blocks"
        )
    return None


class Engine:
    """The engine loop: arrivals on the clock, schedule, synthetic outputs, update."""

    def __init__(
        self, args: argparse.Namespace, scheduler: Any, hasher: Any, clock: SimulatedClock
    ) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        self.args = args
        self.scheduler = scheduler
        self.hasher = hasher
        self.clock = clock
        self.SamplingParams = SamplingParams
        self.ModelRunnerOutput = ModelRunnerOutput
        self.Request = Request
        self.outputs: dict[str, list[int]] = {}  # request id -> the tokens it will emit
        self.high_water: dict[str, int] = {}  # request id -> most tokens ever computed
        self.chunked: set[str] = set()  # requests whose current prefill spans several steps
        self.evictions = 0
        # --time-steps: the scheduler thread's CPU time (thread_time_ns) in vLLM's own calls
        # (add_request, schedule, update_from_output), per step; None: not timed.
        self.step_cpu_ns: list[int] | None = [] if args.time_steps else None
        self.add_cpu_ns = 0
        self.step_ns = 0
        self.cpu_ns = 0  # all of the above: what `steps` yields its differences of
        self.request_digest = 0  # crc32 of the request ids added, in order
        self.end_s = 0.0  # the simulated clock when the last request finished
        self.switches = parse_switches(args.switch_at) if args.switch_at else {}
        self.switched: list[list[Any]] = []  # [step, mode] as applied
        self.totals = {
            "requests": 0,
            "finished": 0,
            "steps": 0,
            "empty_steps": 0,  # schedule() calls that only pass finished ids on
            "preemption_only_steps": 0,  # ... that preempted and scheduled nothing
            "scheduled_tokens": 0,
            "preemptions": 0,
            "recomputed_tokens": 0,
            "recomputed_evicted_tokens": 0,  # of which KV evicted while the request waited
            "chunked_prefills": 0,  # prompts whose first prefill spans several steps
            "chunked_recomputations": 0,  # prefills after a preemption spanning several
            "prefix_cache_requests": 0,
            "prefix_cache_queries": 0,
            "prefix_cache_hits": 0,
            "preempted_prefix_cache_requests": 0,
            "preempted_prefix_cache_queries": 0,
            "preempted_prefix_cache_hits": 0,
            "max_running": 0,
            "max_waiting": 0,
        }
        pool = scheduler.kv_cache_manager.block_pool
        original = pool._maybe_evict_cached_block

        def observed(block: Any) -> bool:
            evicted = original(block)
            if evicted:
                self.evictions += 1
            return evicted

        pool._maybe_evict_cached_block = observed  # this pool only

    def add(self, record: dict[str, Any]) -> None:
        rid = record["request_id"]
        prompt = expand_runs(record["prompt"])
        output = expand_runs(record["output"])
        if not prompt:
            raise DriverError(f"request {rid} has an empty prompt")
        extra: dict[str, Any] = {}
        if record.get("conversation_id") is not None:
            extra["lpc_conversation_id"] = str(record["conversation_id"])
        if self.args.send_probabilities and record.get("probability") is not None:
            extra["lpc_probability"] = float(record["probability"])
        params = self.SamplingParams(
            max_tokens=max(1, len(output)), ignore_eos=True, extra_args=extra or None
        )
        request = self.Request(
            request_id=rid,
            prompt_token_ids=prompt,
            sampling_params=params,
            pooling_params=None,
            arrival_time=float(record["arrival_s"]),
            cache_salt=record.get("cache_salt"),
            block_hasher=self.hasher,
        )
        self.outputs[rid] = output or [0]
        started = time.thread_time_ns()
        self.scheduler.add_request(request)
        spent = time.thread_time_ns() - started
        self.add_cpu_ns += spent
        if self.step_cpu_ns is not None:
            self.cpu_ns += spent
        self.request_digest = zlib.crc32(rid.encode(), self.request_digest)
        self.totals["requests"] += 1

    def run(self, requests: Iterator[dict[str, Any]], sink: IO[str] | None) -> float:
        """Serve every request; the simulated time when the last one finished."""
        for _ in self.steps(requests, sink):
            pass
        return self.end_s

    def steps(self, requests: Iterator[dict[str, Any]], sink: IO[str] | None) -> Iterator[int]:
        """The engine loop, one `schedule()` call at a time (so two engines can be stepped in
        turn): yields the scheduler thread's CPU in vLLM's calls since the previous yield (the
        arrivals added before the call, the call, its `update_from_output`; 0 untimed)."""
        scheduler, args, totals = self.scheduler, self.args, self.totals
        pending = next(requests, None)
        now = 0.0 if pending is None else float(pending["arrival_s"])
        yielded = self.cpu_ns
        while True:
            while pending is not None and pending["arrival_s"] <= now:
                self.add(pending)
                pending = next(requests, None)
            if not scheduler.has_requests():
                if pending is None:
                    self.end_s = now
                    return
                now = float(pending["arrival_s"])  # idle: jump to the next arrival
                continue
            self.clock.now = now
            step = self.totals["steps"] + self.totals["preemption_only_steps"] + 1
            mode = self.switches.pop(step, None)
            if mode is not None:
                from lpc.integrations import vllm_plugin

                vllm_plugin.set_mode(mode, f"--switch-at {step}:{mode}")
                self.switched.append([step, mode])
            started = time.thread_time_ns()
            output = scheduler.schedule()
            self.step_ns = time.thread_time_ns() - started
            total = output.total_num_scheduled_tokens
            if total == 0 and not output.preempted_req_ids:
                # A call that only hands finished requests' ids on, as the engine core's
                # does. With requests unfinished, nothing running and every block free or
                # evictable, nothing could ever be scheduled.
                self._update(output)
                totals["empty_steps"] += 1
                if scheduler.get_num_unfinished_requests():
                    stuck = list(scheduler.requests)[:5]
                    raise DriverError(
                        f"at {now:.3f}s nothing can be scheduled (requests {stuck}): the KV "
                        "pool or max_model_len is too small for them"
                    )
                yield self.cpu_ns - yielded
                yielded = self.cpu_ns
                continue
            # A step; one that scheduled nothing (it preempted the only running request)
            # takes no time.
            record = self._step_record(output, now)
            end = now + (args.step_base_s + args.step_per_token_s * total if total else 0.0)
            self.clock.now = end
            stats = self._update(output)
            self._count(output, stats, record)
            if sink is not None:
                sink.write(json.dumps(record, separators=(",", ":")) + "\n")
            if args.check_every and record["step"] % args.check_every == 0:
                problem = held_blocks_consistent(scheduler)
                if problem is not None:
                    raise DriverError(f"step {record['step']}: {problem}")
            now = end
            yield self.cpu_ns - yielded
            yielded = self.cpu_ns

    def _update(self, output: Any) -> Any:
        """`update_from_output` with the synthetic model output; the step's prefix-cache
        stats, from the `SchedulerStats` it returns (what vLLM's loggers count)."""
        model_output = self._model_output(output)
        started = time.thread_time_ns()
        outputs = self.scheduler.update_from_output(output, model_output)
        if self.step_cpu_ns is not None:
            spent = self.step_ns + time.thread_time_ns() - started
            self.step_cpu_ns.append(spent)
            self.cpu_ns += spent
        for engine_outputs in outputs.values():
            if engine_outputs.scheduler_stats is not None:
                return engine_outputs.scheduler_stats.prefix_cache_stats
        raise DriverError("update_from_output returned no scheduler stats")

    def _model_output(self, output: Any) -> Any:
        """One sampled token per request whose prompt is complete after this step."""
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            request = self.scheduler.requests[rid]
            if request.num_computed_tokens < request.num_tokens:
                sampled.append([])  # a partial prefill chunk: vLLM discards its sample
            else:
                sampled.append([self.outputs[rid][request.num_output_tokens]])
        return self.ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )

    def _step_record(self, output: Any, now: float) -> dict[str, Any]:
        """What the step scheduled, before the model output is applied."""
        scheduler = self.scheduler
        blocks = zlib.crc32(b"")
        new = []
        for data in output.scheduled_new_reqs:
            new.append([data.req_id, data.num_computed_tokens])
            blocks = zlib.crc32(repr((data.req_id, data.block_ids)).encode(), blocks)
        cached = output.scheduled_cached_reqs
        for rid, ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            blocks = zlib.crc32(repr((rid, ids)).encode(), blocks)
        resumed = [
            [rid, n]
            for rid, n in zip(cached.req_ids, cached.num_computed_tokens, strict=True)
            if rid in cached.resumed_req_ids
        ]
        # Of what a resumed request recomputes, the full blocks it had computed (so cached)
        # when it was preempted and did not find again: KV evicted while it waited. The rest
        # (the last, partial block, never cached; the last token, always recomputed) any
        # policy recomputes.
        block = self.args.block_size
        lost_to_eviction = 0
        for rid, hit in resumed:
            high = self.high_water.get(rid, 0)
            findable = min(high, scheduler.requests[rid].num_tokens - 1) // block * block
            lost_to_eviction += max(0, findable - hit)
        scheduled = []
        partial = []  # requests whose prefill this step leaves unfinished (a chunk)
        recomputed = 0
        for rid, n in output.num_scheduled_tokens.items():
            request = scheduler.requests[rid]
            if request.is_prefill_chunk:
                partial.append(rid)
            end = request.num_computed_tokens  # advanced by schedule()
            start = end - n
            high = self.high_water.get(rid, 0)
            recomputed += max(0, min(end, high) - start)
            self.high_water[rid] = max(high, end)
            scheduled.append([rid, n])
        return {
            "step": self.totals["steps"] + self.totals["preemption_only_steps"] + 1,
            "t": round(now, 9),
            "scheduled": scheduled,
            "partial": partial,
            "new": new,
            "resumed": resumed,
            "preempted": sorted(output.preempted_req_ids or ()),
            "blocks": blocks,
            "recomputed": recomputed,
            "lost_to_eviction": lost_to_eviction,
        }

    def _count(self, output: Any, stats: Any, record: dict[str, Any]) -> None:
        totals = self.totals
        if output.total_num_scheduled_tokens:
            totals["steps"] += 1
        else:
            totals["preemption_only_steps"] += 1
        totals["scheduled_tokens"] += output.total_num_scheduled_tokens
        totals["recomputed_tokens"] += record["recomputed"]
        totals["recomputed_evicted_tokens"] += record["lost_to_eviction"]
        preempted = record["preempted"]
        totals["preemptions"] += len(preempted)
        for rid in preempted:
            self.chunked.discard(rid)  # its recomputation is a prefill of its own
        partial = set(record["partial"])
        finished = 0
        for rid, _ in record["scheduled"]:
            request = self.scheduler.requests.get(rid)
            if request is None or request.is_finished():
                finished += 1
                self.outputs.pop(rid, None)
                self.high_water.pop(rid, None)
            if rid in partial:
                if rid not in self.chunked:  # a prefill left unfinished: chunked
                    self.chunked.add(rid)
                    if request is not None and request.num_preemptions:
                        totals["chunked_recomputations"] += 1
                    else:
                        totals["chunked_prefills"] += 1
            else:
                self.chunked.discard(rid)
        totals["finished"] += finished
        record["hits"] = [
            stats.requests,
            stats.queries,
            stats.hits,
            stats.preempted_requests,
            stats.preempted_queries,
            stats.preempted_hits,
        ]
        record["free"] = self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        record["finished"] = finished
        totals["prefix_cache_requests"] += stats.requests
        totals["prefix_cache_queries"] += stats.queries
        totals["prefix_cache_hits"] += stats.hits
        totals["preempted_prefix_cache_requests"] += stats.preempted_requests
        totals["preempted_prefix_cache_queries"] += stats.preempted_queries
        totals["preempted_prefix_cache_hits"] += stats.preempted_hits
        totals["max_running"] = max(totals["max_running"], len(self.scheduler.running))
        totals["max_waiting"] = max(totals["max_waiting"], len(self.scheduler.waiting))


def write_shadow_events(path: Path, events: list[Any]) -> None:
    """The shadow's events in the order it applied them, without hashes (a replay hashes the
    requests' tokens itself): start, admit, finish."""
    from lpc.integrations.shadow import Admission, Start

    with path.open("w", encoding="utf-8") as sink:
        for e in events:
            if isinstance(e, Start):
                line = {"event": "start", "num_blocks": e.num_blocks, "block_size": e.block_size}
            elif isinstance(e, Admission):
                line = {
                    "event": "admit",
                    "request_id": e.request_id,
                    "conversation_id": e.conversation_id,
                    "t": e.time_s,
                    "tokens": e.num_tokens,
                }
            else:
                line = {
                    "event": "finish",
                    "request_id": e.request_id,
                    "t": e.time_s,
                    "p": e.probability,
                    "tokens": e.num_tokens,
                }
            sink.write(json.dumps(line) + "\n")


def scheduler_cpu(step_ns: list[int], add_ns: int) -> dict[str, Any]:
    """The scheduler thread's CPU in vLLM's calls: in all, and per step (schedule plus
    update_from_output, which frees finished requests: the plugin's release and scoring)."""
    ordered = sorted(step_ns)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3 if ordered else 0.0

    return {
        "total_s": round((sum(step_ns) + add_ns) / 1e9, 6),
        "add_request_s": round(add_ns / 1e9, 6),
        "steps": len(step_ns),
        "step_mean_us": round(sum(step_ns) / len(step_ns) / 1e3, 3) if step_ns else 0.0,
        "step_p50_us": round(at(0.5), 3),
        "step_p99_us": round(at(0.99), 3),
    }


def final_invariants(scheduler: Any) -> dict[str, Any]:
    """`pool_invariants` and `held_blocks_consistent` once every request has finished."""
    invariants = pool_invariants(scheduler)
    problem = held_blocks_consistent(scheduler)
    invariants["checks"]["ownership_consistent"] = problem is None
    invariants["ok"] = invariants["ok"] and problem is None
    return invariants


def install_floor_queue(scheduler: Any) -> None:
    """The floor queue (`lpc.benchmarks.floor_queue`) in the scheduler's block pool, over
    vLLM's own queue, before any request."""
    from lpc.benchmarks.floor_queue import RunFloorQueue

    pool = scheduler.kv_cache_manager.block_pool
    pool.free_block_queue = RunFloorQueue(pool.free_block_queue, len(pool.blocks))


def stock_twin(args: argparse.Namespace) -> argparse.Namespace:
    """--interleave's stock engine: the same engine and requests, vLLM's own `Scheduler`
    (no scheduler class, no additional config), nothing switched, nothing recorded."""
    return argparse.Namespace(
        **{
            **vars(args),
            "scheduler_cls": None,
            "additional_config": None,
            "switch_at": "",
            "check_every": 0,
        }
    )


def run_interleaved(stock: Engine, lpc: Engine, requests: Path, sink: IO[str] | None) -> dict:
    """Both engines over the same requests, stepped in turn (`interleave`); the report, and
    the stock engine's own figures and end-state checks."""
    from lpc.drivers.step_interleave import interleave, step_report

    times = interleave(
        stock.steps(read_requests(requests), None), lpc.steps(read_requests(requests), sink)
    )
    scheduler = stock.scheduler
    assert stock.step_cpu_ns is not None
    return {
        **step_report(times),
        "request_digests": {"stock": stock.request_digest, "lpc": lpc.request_digest},
        "stock_engine": {
            "scheduler": type(scheduler).__module__ + "." + type(scheduler).__qualname__,
            "totals": {**stock.totals, "evictions": stock.evictions},
            "simulated_seconds": round(stock.end_s, 6),
            "invariants": final_invariants(scheduler),
            "scheduler_cpu": scheduler_cpu(stock.step_cpu_ns, stock.add_cpu_ns),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=Path, required=True, help="JSON-lines requests")
    parser.add_argument("--records", type=Path, help="write one JSON record per step here")
    parser.add_argument("--summary", type=Path, help="write the JSON summary here too")
    parser.add_argument("--block-size", type=int, required=True)
    parser.add_argument("--num-blocks", type=int, required=True, help="KV pool, null block in")
    parser.add_argument("--max-num-batched-tokens", type=int, required=True)
    parser.add_argument("--max-num-seqs", type=int, required=True)
    parser.add_argument("--max-model-len", type=int, required=True)
    parser.add_argument("--step-base-s", type=float, required=True)
    parser.add_argument("--step-per-token-s", type=float, required=True)
    parser.add_argument(
        "--send-probabilities",
        action="store_true",
        help="requests carry their line's probability as lpc_probability",
    )
    parser.add_argument(
        "--check-every",
        type=int,
        default=0,
        help="check block ownership and reference counts every N steps (0: only at the end)",
    )
    parser.add_argument(
        "--switch-at",
        default="",
        help="with the plugin: STEP:MODE[,STEP:MODE...] switches its mode before that step",
    )
    parser.add_argument(
        "--shadow-events", type=Path, help="with the plugin: write the shadow's event log here"
    )
    parser.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="build the scheduler of one rank of a data-parallel engine of this many ranks",
    )
    parser.add_argument("--data-parallel-rank", type=int, default=0, help="that rank")
    parser.add_argument(
        "--eviction-policy",
        help="CacheConfig.eviction_policy, for a vLLM with the eviction-policy seam "
        "(docs/vllm-eviction-seam.patch); the plugin registers its queue there as lpc",
    )
    parser.add_argument(
        "--scheduler-cls",
        help="SchedulerConfig.scheduler_cls (a Scheduler subclass by qualified name, as "
        "vLLM's --scheduler-cls), e.g. lpc.integrations.vllm_scheduler_class.LPCScheduler",
    )
    parser.add_argument(
        "--additional-config", help="VllmConfig.additional_config, JSON (as vLLM's flag)"
    )
    parser.add_argument(
        "--time-steps",
        action="store_true",
        help="time the scheduler thread's CPU in vLLM's calls per step (the LRU-order check, "
        "a test harness's wrapper of the plugin's queue, is then left out)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="also build stock vLLM's Scheduler in this process over the same requests and step "
        "the two in turn, each step timed (implies --time-steps; the summary's `interleaved`, "
        "lpc.drivers.step_interleave)",
    )
    parser.add_argument(
        "--floor-queue",
        action="store_true",
        help="stock vLLM with lpc.benchmarks.floor_queue.RunFloorQueue in its block pool: what "
        "a queue keyed once per release costs at this seam (it evicts in vLLM's LRU order)",
    )
    parser.add_argument("--label", default="", help="the policy, for the summary")
    args = parser.parse_args(argv)
    if args.interleave:
        args.time_steps = True
    started = time.perf_counter()
    try:
        import vllm

        if vllm.__version__ != EXPECTED_VLLM_VERSION:
            raise DriverError(
                f"vLLM {vllm.__version__} is installed; this driver is pinned to "
                f"{EXPECTED_VLLM_VERSION}"
            )
        clock = SimulatedClock()
        plugins = load_plugins(clock)
        import_seconds = time.perf_counter() - started
        stock_args = stock_twin(args) if args.interleave else None
        with tempfile.TemporaryDirectory(prefix="lpc-scheduler-model-") as model_dir:
            scheduler, hasher = build_scheduler(args, Path(model_dir))
            if args.floor_queue:  # stock vLLM with the floor queue in its pool
                install_floor_queue(scheduler)
            if stock_args is not None:  # its own clock: only the plugin's engine's is read
                stock_scheduler = build_scheduler(stock_args, Path(model_dir))[0]
                stock = Engine(stock_args, stock_scheduler, hasher, SimulatedClock())
        if args.scheduler_cls and not plugins.get("lpc"):
            # A scheduler class may register LPC as it is built: nothing released yet.
            from lpc.integrations import vllm_plugin

            if vllm_plugin.is_registered():
                plugins["lpc"] = True
                plugins["config"] = simulate_plugin_clock(clock)
        engine = Engine(args, scheduler, hasher, clock)
        order_check = None
        shadow_events: list[Any] | None = None
        if plugins.get("lpc"):
            from lpc.integrations import vllm_plugin
            from lpc.integrations.vllm_queue import LPCFreeBlockQueue

            pool = scheduler.kv_cache_manager.block_pool
            queue = pool.free_block_queue
            if not isinstance(queue, LPCFreeBlockQueue):  # off in lru: vLLM's own queue
                switch = vllm_plugin.registered_runtime().queues.mode
                queue = next(
                    q
                    for q in switch.followers
                    if isinstance(q, LPCFreeBlockQueue) and q._pool is pool
                )
            if not args.time_steps:
                order_check = LRUOrderCheck(pool, queue)
            if args.shadow_events is not None:
                shadow_events = vllm_plugin._REGISTRATION.runtime.shadow.events = []
        elif args.switch_at or args.shadow_events:
            raise DriverError("--switch-at and --shadow-events need the LPC plugin")
        run_started = time.perf_counter()
        sink = args.records.open("w", encoding="utf-8") if args.records else None
        interleaved = None
        try:
            if stock_args is None:
                end_s = engine.run(read_requests(args.requests), sink)
            else:
                interleaved = run_interleaved(stock, engine, args.requests, sink)
                end_s = engine.end_s
        finally:
            if sink is not None:
                sink.close()
        run_seconds = time.perf_counter() - run_started
        invariants = final_invariants(scheduler)
        summary: dict[str, Any] = {
            "label": args.label,
            "vllm_version": vllm.__version__,
            "scheduler": type(scheduler).__module__ + "." + type(scheduler).__qualname__,
            "plugins": plugins,
            "totals": {**engine.totals, "evictions": engine.evictions},
            "simulated_seconds": round(end_s, 6),
            "invariants": invariants,
            "import_seconds": round(import_seconds, 2),
            "run_seconds": round(run_seconds, 2),
            "config": {
                "block_size": args.block_size,
                "num_blocks": args.num_blocks,
                "max_num_batched_tokens": args.max_num_batched_tokens,
                "max_num_seqs": args.max_num_seqs,
                "max_model_len": args.max_model_len,
                "step_base_s": args.step_base_s,
                "step_per_token_s": args.step_per_token_s,
                "data_parallel_size": scheduler.vllm_config.parallel_config.data_parallel_size,
                "data_parallel_rank": scheduler.vllm_config.parallel_config.data_parallel_rank,
                "chunked_prefill": scheduler.scheduler_config.enable_chunked_prefill,
                "prefix_caching": scheduler.cache_config.enable_prefix_caching,
            },
        }
        if engine.step_cpu_ns is not None:
            summary["scheduler_cpu"] = scheduler_cpu(engine.step_cpu_ns, engine.add_cpu_ns)
        if interleaved is not None:
            summary["interleaved"] = interleaved
        if plugins.get("lpc"):
            from lpc.integrations import vllm_plugin

            if not vllm_plugin.drain_shadow(600.0):
                raise DriverError("the shadow caches did not catch up within 600 s")
            summary["plugin_stats"] = vllm_plugin.stats_snapshot()
            summary["mode_switches"] = engine.switched
            if order_check is not None:
                summary["lru_order_check"] = order_check.counts
            if shadow_events is not None:
                write_shadow_events(args.shadow_events, shadow_events)
    except (DriverError, ImportError, ValueError) as exc:
        print(f"vllm_scheduler_replay: error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(summary, default=str)
    if args.summary is not None:
        args.summary.write_text(text + "\n", encoding="utf-8")
    print(text, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
