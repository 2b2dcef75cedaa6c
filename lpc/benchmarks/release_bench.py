"""Latency of the vLLM plugin's release path, with the access model in process.

One release is what the plugin does when vLLM frees a finished request: `PluginRuntime`'s
`safe_release_for` (the request's p, or with `lpc-return` its return curve) and then the LPC
queue's `append_n` of the request's blocks under that release. Requests and blocks are
duck-typed like vLLM 0.33's `Request` and `KVCacheBlock`.

What one release includes and the workload: docs/design.md, "The release-path benchmark"; the
figures: docs/serving.md, "Release-path latency".
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import random
import statistics
import time
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lpc.integrations.config import PluginConfig
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_plugin import PluginRuntime, build_runtime
from lpc.integrations.vllm_queue import LPCFreeBlockQueue, bind_queue_class

DEFAULT_SIZES = (1_024, 11_264, 131_072)  # 1K, 11K, 128K tokens per request
TARGET_P50_US = 20.0
TARGET_P99_US = 100.0
MESSAGE_TOKENS = 64  # new tokens of each request's prompt
OUTPUT_TOKENS = 64


@dataclass
class Params:
    extra_args: dict[str, Any] | None = None


@dataclass
class BenchRequest:
    """The attributes of vLLM's `Request` the plugin reads at a release."""

    request_id: str
    arrival_time: float
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    block_hashes: list[bytes]
    sampling_params: Params = field(default_factory=Params)

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


@dataclass
class BenchBlock:
    """The attributes of vLLM's `KVCacheBlock` the LPC queue reads."""

    block_id: int
    block_hash: bytes | None = None
    block_hash_num_tokens: int | None = None


@dataclass
class Latency:
    p50_us: float
    p99_us: float
    mean_us: float
    max_us: float

    @classmethod
    def of(cls, ns: list[int]) -> Latency:
        ordered = sorted(ns)
        n = len(ordered)
        return cls(
            round(ordered[n // 2] / 1e3, 2),
            round(ordered[min(n - 1, int(0.99 * n))] / 1e3, 2),
            round(statistics.fmean(ordered) / 1e3, 2),
            round(ordered[-1] / 1e3, 2),
        )


@dataclass
class SizeResult:
    tokens: int
    blocks_per_release: int
    releases: int
    release_for: Latency  # the plugin's per-request work (p, features, table)
    append_n: Latency  # the LPC queue taking the request's blocks
    total: Latency  # both: the release path
    shared_prefix_tokens: int  # what the features saw (the history), checked
    target_met: bool  # total within ≤ 20 µs p50 and ≤ 100 µs p99
    release_for_target_met: bool


@dataclass
class ReleaseBenchResult:
    model: str | None  # the access model (None: none loaded)
    evictor: str
    block_size: int
    conversations: int
    sizes: list[SizeResult]
    target: str
    load_average: float
    return_model: str | None = None  # lpc-return's curves

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def chained_hashes(tokens: list[int], block_size: int, parent: bytes = b"") -> list[bytes]:
    """Chained hashes of the full blocks of `tokens` (vLLM's shape of `block_hashes`)."""
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = array("q", tokens[start : start + block_size]).tobytes()
        parent = hashlib.sha256(parent + block).digest()
        out.append(parent)
    return out


class Conversation:
    """One conversation of the workload: a fixed history, then a new message per request."""

    def __init__(self, name: str, tokens: int, block_size: int, rng: random.Random) -> None:
        history = tokens - MESSAGE_TOKENS - OUTPUT_TOKENS
        history -= history % block_size
        self.name = name
        self.block_size = block_size
        self.history = [rng.randrange(150_000) for _ in range(history)]
        self.history_hashes = chained_hashes(self.history, block_size)
        self.rng = rng
        self.turn = 0

    def next_request(self, arrival_s: float) -> BenchRequest:
        rng = self.rng
        message = [150_000 + rng.randrange(1_000) for _ in range(MESSAGE_TOKENS)]
        output = [rng.randrange(150_000) for _ in range(OUTPUT_TOKENS)]
        prompt = self.history + message
        tail = chained_hashes(message + output, self.block_size, self.history_hashes[-1])
        self.turn += 1
        return BenchRequest(
            f"{self.name}-{self.turn}",
            arrival_s,
            prompt,
            output,
            self.history_hashes + tail,
            Params({"lpc_conversation_id": self.name}),
        )


class StepClock:
    """The plugin's clock: a second passes per release (think times of the workload)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _release_one(
    runtime: PluginRuntime, queue: LPCFreeBlockQueue, request: BenchRequest, blocks: list[Any]
) -> tuple[int, int]:
    """(ns in safe_release_for, ns in append_n) for one request: what `KVCacheManager.free`
    -> `BlockPool.free_blocks` -> `append_n` costs the plugin."""
    timer = time.perf_counter_ns
    start = timer()
    release = runtime.safe_release_for(request)
    middle = timer()
    with runtime.queues.releasing(release):
        queue.append_n(blocks)
    return middle - start, timer() - middle


def run_size(
    model: Path | None,
    tokens: int,
    releases: int,
    conversations: int,
    block_size: int,
    evictor: str,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    return_model: Path | None = None,
) -> SizeResult:
    clock = StepClock()
    config = PluginConfig(
        access_model=None if model is None else str(model),
        return_model=None if return_model is None else str(return_model),
        evictor=evictor,
        stats_log_interval_s=0.0,
    )
    runtime = build_runtime(config, clock=clock)
    access = runtime.access
    assert access is not None
    access.block_size = block_size  # what the plugin reads from vLLM's BlockPool
    blocks_per_request = tokens // block_size
    num_blocks = 4 * blocks_per_request + 64
    pool = [BenchBlock(i) for i in range(num_blocks)]
    queue = bind_queue_class(runtime.queues)(pool)
    rng = random.Random(seed)
    chats = [Conversation(f"c{i}", tokens, block_size, rng) for i in range(conversations)]
    release_ns: list[int] = []
    append_ns: list[int] = []
    shared: set[int] = set()
    warmup = conversations  # every conversation has a table entry before timing
    for i in range(warmup + releases):
        chat = chats[i % conversations]
        clock.now += 1.0
        request = chat.next_request(clock.now - 0.5)
        popped = queue.popleft_n(blocks_per_request)
        for depth, block in enumerate(popped):
            block.block_hash = request.block_hashes[depth]
            block.block_hash_num_tokens = (depth + 1) * block_size
        popped.reverse()  # vLLM frees a request's blocks tail first
        if i == warmup:
            gc.collect()
        entry = access.table.entries.get(chat.name)
        if i >= warmup:
            r, a = _release_one(runtime, queue, request, popped)
            release_ns.append(r)
            append_ns.append(a)
            assert entry is not None and entry.previous is not None
            shared.add(len(chat.history))
        else:
            _release_one(runtime, queue, request, popped)
        access.compact_pending()  # the background thread's work, outside the timing
        if progress is not None and i and i % 1000 == 0:
            progress(f"{tokens} tokens: {i}/{warmup + releases}")
    _check_stats(runtime.stats, warmup + releases, model is not None, return_model is not None)
    total = [r + a for r, a in zip(release_ns, append_ns, strict=True)]
    result_total = Latency.of(total)
    result_release = Latency.of(release_ns)
    return SizeResult(
        tokens,
        blocks_per_request,
        releases,
        result_release,
        Latency.of(append_ns),
        result_total,
        _check_shared_prefix(runtime, chats[0], block_size),
        result_total.p50_us <= TARGET_P50_US and result_total.p99_us <= TARGET_P99_US,
        result_release.p50_us <= TARGET_P50_US and result_release.p99_us <= TARGET_P99_US,
    )


def _check_stats(stats: PluginStats, expected: int, predicts: bool, returns: bool) -> None:
    """Every release made the prediction and the curve it was asked for, with no plugin
    error: a release that fell back would time the fallback, not the path."""
    computed = {
        "in-process predictions": (stats.predictions_in_process, predicts),
        "return curves": (stats.return_curves_in_process, returns),
    }
    missing = [
        f"{done} {what} of {expected}"
        for what, (done, asked) in computed.items()
        if done != (expected if asked else 0)
    ]
    if stats.plugin_errors or missing:
        raise RuntimeError(
            f"the release path failed: {stats.plugin_errors} plugin errors; {', '.join(missing)}"
        )


def _check_shared_prefix(runtime: PluginRuntime, chat: Conversation, block_size: int) -> int:
    """The shared prefix the features see for this conversation's next request: its history
    (checked, so the timed path computed the value the model needs)."""
    from lpc.integrations.conversation_table import shared_prefix

    access = runtime.access
    assert access is not None
    entry = access.table.entries[chat.name]
    request = chat.next_request(0.0)
    value = shared_prefix(
        entry.previous,
        request.prompt_token_ids,
        request.num_prompt_tokens,
        request.block_hashes,
        block_size,
    )
    if value < len(chat.history):
        raise RuntimeError(f"shared prefix {value} < the history's {len(chat.history)} tokens")
    return value


def run(
    model: Path | None,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    releases: int = 5_000,
    conversations: int = 16,
    block_size: int = 16,
    evictor: str = "lpc-pooled",
    progress: Callable[[str], None] | None = None,
    return_model: Path | None = None,
) -> ReleaseBenchResult:
    results = [
        run_size(
            model,
            tokens,
            releases,
            conversations,
            block_size,
            evictor,
            progress=progress,
            return_model=return_model,
        )
        for tokens in sizes
    ]
    return ReleaseBenchResult(
        None if model is None else str(model),
        evictor,
        block_size,
        conversations,
        results,
        f"release path p50 <= {TARGET_P50_US:g} µs, p99 <= {TARGET_P99_US:g} µs at every size",
        os.getloadavg()[0],
        None if return_model is None else str(return_model),
    )


def summary_lines(result: ReleaseBenchResult) -> list[str]:
    """The figures as text: the conditions, then p50/p99/mean/max per size and part, and
    whether each size met the target."""
    models = ", ".join(
        f"{what} {path}"
        for what, path in (("model", result.model), ("return model", result.return_model))
        if path is not None
    )
    lines = [
        f"release path, {models}, evictor {result.evictor}, block size "
        f"{result.block_size}, {result.conversations} conversations; target: {result.target}",
        f"{'tokens':>8} {'blocks':>6}  {'part':<12} {'p50 µs':>8} {'p99 µs':>8} {'mean µs':>8} "
        f"{'max µs':>9}",
    ]
    for size in result.sizes:
        for label, latency in (
            ("release_for", size.release_for),
            ("append_n", size.append_n),
            ("total", size.total),
        ):
            lines.append(
                f"{size.tokens:>8} {size.blocks_per_release:>6}  {label:<12} "
                f"{latency.p50_us:>8.1f} {latency.p99_us:>8.1f} {latency.mean_us:>8.1f} "
                f"{latency.max_us:>9.1f}"
            )
        verdict = "met" if size.target_met else "MISSED"
        own = "met" if size.release_for_target_met else "MISSED"
        lines.append(f"{'':>16}target: total {verdict}, release_for alone {own}")
    lines.append(f"load average {result.load_average:.1f}")
    return lines
