"""What the request log costs: µs per finished request on the release path, and how many
records per second the writer thread turns into lines on disk.

Release path: the same LRU replay of a synthetic multi-turn chat workload through our block
manager, without a log and with one, best of `repeats`; in the logged replay the writer
thread is held (its first `open` waits, the queue holds every record), so only what the
releasing thread pays counts: the record and `put_nowait`. The plugin's own path
(`PluginRequestLog.finished` on a vLLM-like request object) is timed alone too. Writer: the
held thread is let go, and the time it takes to write the queued records (keyed block ids,
JSON, `os.write`) gives records per second; a third replay with the writer running alongside
shows what both threads cost together (they share the GIL).
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lpc.integrations.config import PluginConfig
from lpc.integrations.plugin_request_log import PluginRequestLog
from lpc.integrations.request_hints import RequestHints
from lpc.integrations.request_log import (
    LogFile,
    RequestLogConfig,
    RequestLogWriter,
    open_append,
)
from lpc.replay.policies import parse_policy
from lpc.replay.simulator import PreparedWorkload, finished_request, prepare, replay
from lpc.workload import ScriptedTurn, WorkloadRequest, compact_tokens

BLOCK_SIZE = 16
CACHE_TOKENS = 200_000


@dataclass(frozen=True)
class LogBenchResult:
    requests: int
    mean_blocks_per_request: float
    replay_without_log_s: float
    replay_with_log_s: float  # writer held: the releasing thread's cost only
    release_overhead_us: float  # per finished request: the two replays' difference
    release_calls_us: float  # the calls the logged replay adds, timed alone, per request
    plugin_record_us: float  # PluginRequestLog.finished alone, per request
    writer_records_per_s: float
    writer_bytes_per_record: float
    replay_with_running_writer_s: float
    running_writer_overhead_us: float  # per request, both threads sharing the GIL
    repeats: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def chat_workload(num_conversations: int, seed: int) -> list[WorkloadRequest]:
    """Multi-turn chats (a shared system prompt for half of them; each prompt repeats the
    previous prompt and reply) interleaved over an hour, with think times."""
    rng = random.Random(seed)
    system = [rng.randrange(50_000) for _ in range(300)]
    requests = []
    for c in range(num_conversations):
        cid = f"c{c}"
        history = list(system) if rng.random() < 0.5 else []
        t = rng.uniform(0, 3600)
        num_turns = rng.randint(1, 8)
        for k in range(num_turns):
            prompt = history + [rng.randrange(50_000) for _ in range(rng.randint(20, 400))]
            output = [rng.randrange(50_000) for _ in range(rng.randint(20, 400))]
            turn = ScriptedTurn(
                cid, k, compact_tokens(prompt + output), len(prompt), k + 1 < num_turns
            )
            done = t + rng.uniform(1, 20)
            requests.append(WorkloadRequest(f"{cid}#{k}", turn, t, done))
            t = done + rng.expovariate(1 / 60)
            history = prompt + output
    requests.sort(key=lambda r: r.arrival_s)
    return requests


class _HeldDisk:
    """Opens log files only once `release` is set: holds the writer thread off the GIL."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, path: Path) -> LogFile:
        self.release.wait()
        return open_append(path)


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _plugin_record_us(workload: PreparedWorkload, directory: Path) -> float:
    """`PluginRequestLog.finished` on vLLM-like finished requests (writer held)."""
    held = _HeldDisk()
    log = PluginRequestLog(PluginConfig(request_log_dir=str(directory)), time.time)
    log._writer = RequestLogWriter(
        RequestLogConfig(directory, queue_size=len(workload.requests) + 1), open_file=held
    )
    params = types.SimpleNamespace(extra_args={"lpc_probability": 0.5})
    fakes = [
        types.SimpleNamespace(
            request_id=r.request_id,
            arrival_time=r.arrival_s,
            num_prompt_tokens=c.num_prompt_tokens,
            num_output_tokens=len(c.token_ids) - c.num_prompt_tokens,
            block_hashes=c.block_hashes,
            sampling_params=params,
            num_preemptions=0,
            is_finished=lambda: True,
        )
        for r, c in zip(workload.requests, workload.cache_requests, strict=True)
    ]
    hints = RequestHints(probability=0.5, conversation_id="c")
    finished = log.finished
    start = time.perf_counter()
    for fake in fakes:
        finished(fake, hints, 0.5, "client")
    elapsed = time.perf_counter() - start
    held.release.set()
    log.close()
    return 1e6 * elapsed / len(fakes)


def _release_calls_us(workload: PreparedWorkload, directory: Path) -> float:
    """What the logged replay adds per release, timed alone: `finished_request` and the
    writer's `append` (held), for every request of the workload."""
    held = _HeldDisk()
    writer = RequestLogWriter(
        RequestLogConfig(directory, queue_size=len(workload.requests) + 1), open_file=held
    )
    pairs = list(zip(workload.requests, workload.cache_requests, strict=True))
    append = writer.append
    start = time.perf_counter()
    for request, cache_request in pairs:
        append(finished_request(request, cache_request, request.completion_s, 0, None))
    elapsed = time.perf_counter() - start
    held.release.set()
    writer.close()
    return 1e6 * elapsed / len(pairs)


def run_log_bench(num_conversations: int = 5000, repeats: int = 3, seed: int = 0) -> LogBenchResult:
    requests = chat_workload(num_conversations, seed)
    workload = prepare(requests, BLOCK_SIZE, {})
    spec = parse_policy("lru")
    n = len(requests)
    blocks = sum(len(c.block_hashes or ()) for c in workload.cache_requests) / n
    best_plain = best_logged = best_running = float("inf")
    writer_rate = bytes_per_record = 0.0
    with tempfile.TemporaryDirectory(prefix="lpc-log-bench-") as tmp:
        for r in range(repeats):
            best_plain = min(best_plain, _timed(lambda: replay(workload, spec, CACHE_TOKENS)))

            held = _HeldDisk()
            writer = RequestLogWriter(
                RequestLogConfig(Path(tmp) / f"held{r}", salt="bench", queue_size=n + 1),
                open_file=held,
            )
            best_logged = min(
                best_logged,
                _timed(lambda w=writer: replay(workload, spec, CACHE_TOKENS, request_log=w)),
            )
            start = time.perf_counter()
            held.release.set()
            writer.flush(600.0)
            drain_s = time.perf_counter() - start
            writer.close()
            counters = writer.counters.snapshot()
            assert counters["records_written"] == n, counters
            writer_rate = max(writer_rate, n / drain_s)
            bytes_per_record = counters["bytes_written"] / n

            running = RequestLogWriter(
                RequestLogConfig(Path(tmp) / f"running{r}", salt="bench", queue_size=n + 1)
            )

            def logged_and_written(w: RequestLogWriter = running) -> None:
                replay(workload, spec, CACHE_TOKENS, request_log=w)
                w.flush(600.0)

            best_running = min(best_running, _timed(logged_and_written))
            running.close()
        plugin_us = min(_plugin_record_us(workload, Path(tmp) / f"plugin{r}") for r in range(3))
        calls_us = min(_release_calls_us(workload, Path(tmp) / f"calls{r}") for r in range(3))
    return LogBenchResult(
        requests=n,
        mean_blocks_per_request=blocks,
        replay_without_log_s=best_plain,
        replay_with_log_s=best_logged,
        release_overhead_us=1e6 * (best_logged - best_plain) / n,
        release_calls_us=calls_us,
        plugin_record_us=plugin_us,
        writer_records_per_s=writer_rate,
        writer_bytes_per_record=bytes_per_record,
        replay_with_running_writer_s=best_running,
        running_writer_overhead_us=1e6 * (best_running - best_plain) / n,
        repeats=repeats,
    )


def summary_lines(r: LogBenchResult) -> list[str]:
    """The figures as text: the release path's overhead, the calls alone, the writer."""
    return [
        f"request log, {r.requests} finished requests ({r.mean_blocks_per_request:.0f} blocks "
        f"each on average), best of {r.repeats}:",
        f"  release path: {r.release_overhead_us:.2f} µs per request (replay "
        f"{r.replay_without_log_s:.3f} s without the log, {r.replay_with_log_s:.3f} s with it)",
        f"  the calls the logged replay adds, timed alone: {r.release_calls_us:.2f} µs",
        f"  the vLLM plugin's record path, timed alone: {r.plugin_record_us:.2f} µs",
        f"  writer: {r.writer_records_per_s:,.0f} records/s "
        f"({r.writer_bytes_per_record:.0f} bytes per record)",
        f"  writer running alongside: {r.running_writer_overhead_us:.2f} µs per request "
        f"(both threads, one GIL)",
    ]
