"""Independent replays fanned out: serially here, or as Ray tasks on one machine or a cluster.

Every replay of a grid (a fleet cell, a single-instance grid cell: a fleet cell of one
instance) reads the same prepared workload and nothing else, so they are independent tasks.
`run_cells` replays them serially, or puts the workload in Ray's object store once and runs one
task per cell: locally (`ray.init` with `workers` CPUs) by default, or on the cluster at
`address` (`ray://host:10001`, or `auto` for the cluster this process runs in). A replay is a
deterministic function of the workload and the cell, so the results equal the serial run's
digit for digit (a test checks). The daily job's reading of a fleet's request logs runs on
the same plumbing (`RayMapper`: one task per log file, then per group of conversations for
the request table; `lpc.access.log_retrain`). Ray is an optional extra (`pip install
lpc[ray]`), imported only here and only when asked for.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lpc.errors import InvalidInputError, UserError
from lpc.fleet.replay import FleetCell, FleetResult, check_cell, fleet_replay
from lpc.replay.ab import ReplayConstants
from lpc.replay.simulator import PreparedWorkload

EXECUTORS = ("serial", "ray")


@dataclass(frozen=True)
class Executor:
    """Where replays run: `serial` (this process) or `ray` (local, or the cluster at
    `address`), with `workers` CPUs when Ray starts locally."""

    kind: str = "serial"
    address: str | None = None
    workers: int = 2

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise InvalidInputError(
                f"unknown executor {self.kind!r}; choose from {', '.join(EXECUTORS)}"
            )
        if self.workers < 1:
            raise InvalidInputError(f"workers must be >= 1, got {self.workers}")
        if self.address is not None and self.kind != "ray":
            raise InvalidInputError("a cluster address goes with the ray executor")


def replay_cell(
    workload: PreparedWorkload, settings: ReplayConstants, cell: FleetCell
) -> FleetResult:
    """One cell with the settings `lpc ab` replays with (scale, fallback, fitted constants)."""
    return fleet_replay(
        workload,
        cell,
        settings.scale_per_s,
        settings.fallback_probability,
        settings.policy_options.get(cell.policy.evictor),
    )


def start_ray(executor: Executor) -> Any:
    """`ray` initialised for `executor` (a local instance, or the cluster at its address);
    a missing extra or a Ray that cannot start is one clear error."""
    try:
        import ray
    except ModuleNotFoundError:
        raise InvalidInputError(
            "the ray executor needs Ray: pip install 'lpc[ray]' (or run without --ray)"
        ) from None
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if executor.address is None:
        kwargs["num_cpus"] = executor.workers
    try:
        ray.init(address=executor.address, **kwargs)
    except Exception as error:  # Ray raises many kinds; all mean "no cluster to run on"
        where = executor.address or "locally"
        raise InvalidInputError(f"Ray could not start {where}: {error}") from None
    return ray


def map_on_ray(
    executor: Executor,
    function: Callable[[Any, Any], Any],
    shared: Any,
    items: Sequence[Any],
    on_result: Callable[[Any], None] | None = None,
) -> list[Any]:
    """`[function(shared, item) for item in items]` as Ray tasks, `shared` sent once through
    the object store; results in the order of `items`, `on_result` called as each finishes.

    Ray's driver prints the cluster's messages (a worker killed for memory, "(raylet) ...") on
    standard output; they go to standard error here, so that `--json` output stays JSON."""
    with contextlib.redirect_stdout(sys.stderr):
        ray = start_ray(executor)
        shared_ref = ray.put(shared)
        task = ray.remote(num_cpus=1)(function)
        refs = [task.remote(shared_ref, item) for item in items]
        order = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                results[order[ref]] = value = ray.get(ref)
                if on_result is not None:
                    on_result(value)
    return results


def worker_and_peak() -> tuple[str, int]:
    """This worker (node and process) and its peak resident memory in bytes so far (Linux
    reports `ru_maxrss` in KiB)."""
    import resource
    import socket

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return f"{socket.gethostname()}:{os.getpid()}", peak


def _replay_shared(
    shared: tuple[PreparedWorkload, ReplayConstants], cell: FleetCell
) -> tuple[FleetResult, str, int]:
    """A cell replayed in a Ray worker, with the worker and its peak memory."""
    workload, settings = shared
    result = replay_cell(workload, settings, cell)
    return result, *worker_and_peak()


def run_cells(
    workload: PreparedWorkload,
    settings: ReplayConstants,
    cells: Sequence[FleetCell],
    executor: Executor | None = None,
    on_result: Callable[[FleetResult], None] | None = None,
    worker_peak_bytes: dict[str, int] | None = None,
) -> list[FleetResult]:
    """Every cell's replay, in the order of `cells`, on `executor` (serial by default). On
    Ray, `worker_peak_bytes` (when given) receives each worker's peak resident memory."""
    executor = executor or Executor()
    for cell in cells:
        check_cell(cell)  # before any task starts
    if executor.kind == "serial" or not cells:
        results = []
        for cell in cells:
            results.append(replay_cell(workload, settings, cell))
            if on_result is not None:
                on_result(results[-1])
        return results
    peaks = worker_peak_bytes if worker_peak_bytes is not None else {}

    def received(value: tuple[FleetResult, str, int]) -> None:
        result, worker, peak = value
        peaks[worker] = max(peaks.get(worker, 0), peak)
        if on_result is not None:
            on_result(result)

    done = map_on_ray(executor, _replay_shared, (workload, settings), cells, received)
    return [result for result, _, _ in done]


def settings_dict(settings: ReplayConstants) -> dict[str, Any]:
    """The replay settings as JSON (for the report)."""
    options: Mapping[str, Mapping[str, Any]] = settings.policy_options
    return {
        "scale_per_s": settings.scale_per_s,
        "fallback_probability": settings.fallback_probability,
        "policy_options": {k: dict(v) for k, v in options.items()},
    }


def _call_guarded(
    shared: tuple[Callable[[Any, Any], Any], Any], item: Any
) -> tuple[Any, UserError | None, float, str, int]:
    """`function(shared, item)` in a Ray worker; bad input comes back as the error itself
    (Ray would wrap it in its traceback), with the call's processor seconds, the worker and
    its peak memory."""
    import time

    function, argument = shared
    started = time.process_time()
    try:
        result, error = function(argument, item), None
    except UserError as bad:
        result, error = None, bad
    return result, error, time.process_time() - started, *worker_and_peak()


@dataclass
class RayMapper:
    """`function(shared, item)` for every item as Ray tasks (`map_on_ray`), results in the
    items' order: e.g. one task per log file (`lpc.traces.files.FileMapper`). The first item
    (in that order) whose input is bad raises its own error, once every task is done.
    `on_item(done, total)` reports progress; `worker_peak_bytes` gathers each worker's peak
    resident memory, `task_cpu_s` the tasks' processor seconds, over every call."""

    executor: Executor
    on_item: Callable[[int, int], None] | None = None
    worker_peak_bytes: dict[str, int] = field(default_factory=dict)
    task_cpu_s: float = 0.0

    def __call__(
        self, function: Callable[[Any, Any], Any], shared: Any, items: Sequence[Any]
    ) -> list[Any]:
        done = [0]

        def received(value: tuple[Any, UserError | None, float, str, int]) -> None:
            _, _, cpu_s, worker, peak = value
            self.worker_peak_bytes[worker] = max(self.worker_peak_bytes.get(worker, 0), peak)
            self.task_cpu_s += cpu_s
            done[0] += 1
            if self.on_item is not None:
                self.on_item(done[0], len(items))

        results = map_on_ray(self.executor, _call_guarded, (function, shared), items, received)
        for _, error, *_ in results:
            if error is not None:
                raise error
        return [result for result, *_ in results]
