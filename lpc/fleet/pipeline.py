"""`lpc fleet` end to end: the fleet workload per instance count, the grid of routers ×
policies × sizes, intervals, and the report files.

The workload is built by `lpc ab`'s own stages (load, fit on the training part, predict,
prepare): the same requests, probabilities, return curves, decay scale, fallback and fitted
constants `lpc ab --trace` replays, so one instance gives `lpc ab`'s hit tokens. A trace is
scaled to a fleet of k copies (`lpc.fleet.scale`; k = the instance count unless given), so
each instance carries the original trace's load on average; a generated workload (ShareGPT)
is scaled by k times the active conversations, i.e. k times the rate.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from lpc import __version__
from lpc.errors import InvalidInputError
from lpc.fleet.fanout import Executor, run_cells, settings_dict
from lpc.fleet.replay import FleetCell, FleetResult
from lpc.fleet.scale import write_scaled_trace
from lpc.replay.ab import TRACE_CACHE_SIZES_TOKENS, ReplayConstants
from lpc.replay.ab_options import (
    DATASET_MAX_MODEL_LEN,
    TRACE_MAX_MODEL_LEN,
    ABOptions,
    ModelSourceFactory,
)
from lpc.replay.ab_plan import build_workload, dataset_context, load_inputs
from lpc.replay.ab_run import workload_summary
from lpc.replay.ab_sources import fit_policy_constants, fit_sources
from lpc.replay.intervals import paired_gain_interval
from lpc.replay.simulator import PreparedWorkload, RequestHits, prepare
from lpc.traces.expand import check_block_size

BASELINE = "lru"


@dataclass(frozen=True)
class FleetOptions:
    """The fleet grid. `ab` carries the workload settings `lpc ab` takes (trace, split,
    latency, model paths, policies); its cache sizes are per instance."""

    ab: ABOptions
    instance_counts: tuple[int, ...] = (1, 4)
    routers: tuple[str, ...] = ("round-robin", "least-loaded", "session-sticky", "prefix-aware")
    copies: int | None = None  # None: as many copies of the trace as instances
    executor: Executor = field(default_factory=Executor)
    out_dir: Path = Path("results/fleet")
    progress: bool = True


@dataclass
class FleetWorkload:
    """One prepared fleet workload and the settings its replays use."""

    workload: PreparedWorkload
    settings: ReplayConstants
    summary: dict[str, Any]


def prepare_workload(
    options: ABOptions,
    model_factory: ModelSourceFactory | None,
    log: Callable[[str], None],
) -> FleetWorkload:
    """`lpc ab`'s stages 1–3 and its `prepare` call, stopping before its grid."""
    is_trace = options.trace is not None
    options = replace(
        options,
        max_model_len=options.max_model_len
        or (TRACE_MAX_MODEL_LEN if is_trace else DATASET_MAX_MODEL_LEN),
    )
    if options.workload.latency.closed_loop:
        raise InvalidInputError("the fleet replays a fixed timeline; it cannot run --closed-loop")
    loaded = load_inputs(options, log)
    context = dataset_context(loaded.dataset)
    work = build_workload(loaded, context, log)
    replayer = fit_sources(work, context, model_factory)
    fit_policy_constants(loaded, work, context, replayer)
    requests = work.requests
    values = replayer.predictions(requests)
    block_size = work.options.block_size
    assert block_size is not None
    if work.trace_info and work.trace_block_size:
        check_block_size(block_size, work.trace_block_size)
    workload = prepare(
        requests,
        block_size,
        values,
        first_counted=work.first_counted,
        categories=replayer.categories(requests),
        curves=replayer.curves(requests),
    )
    settings = replayer.settings_for(requests)
    summary = workload_summary(workload, requests, work.options, work.source_desc)
    if replayer.fits.report:
        summary["fitted_policies"] = replayer.fits.report
    if work.trace_info:
        summary["trace"] = work.trace_info
    summary["settings"] = settings_dict(settings)
    return FleetWorkload(workload, settings, summary)


@dataclass(frozen=True)
class CellFigures:
    """A cell's figures with their 95 % intervals (paired bootstrap over conversations)."""

    result: FleetResult
    hit_ratio_ci95: list[float] | None
    gain_over_lru: float | None
    gain_over_lru_ci95: list[float] | None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.result.to_dict(),
            "token_hit_ratio_ci95": self.hit_ratio_ci95,
            "gain_over_lru": self.gain_over_lru,
            "gain_over_lru_ci95": self.gain_over_lru_ci95,
        }


def hit_ratio_interval(hits: RequestHits, prompt_tokens: np.ndarray) -> list[float] | None:
    """The token hit ratio's 95 % interval: Σ hits / Σ prompt tokens is the paired "gain" of
    the hits over the prompt tokens plus one, resampled by conversation as every interval of
    the project is (`lpc.replay.intervals`)."""
    queried = RequestHits(np.asarray(prompt_tokens, dtype=np.int64), hits.conversations)
    interval = paired_gain_interval(hits, queried)
    return None if interval is None else [1.0 + interval.low, 1.0 + interval.high]


def figures(results: Sequence[FleetResult], workload: PreparedWorkload) -> list[CellFigures]:
    """Intervals for every cell, and each policy's gain over LRU under the same router,
    instance count and size."""
    prompt = np.fromiter(
        (r.num_prompt_tokens for r in workload.cache_requests[workload.first_counted :]),
        np.int64,
    )
    baseline = {(r.router, r.instances, r.cache_tokens): r for r in results if r.policy == BASELINE}
    out = []
    for r in results:
        assert r.per_request is not None
        base = baseline.get((r.router, r.instances, r.cache_tokens))
        gain = gain_ci = None
        if base is not None and r is not base and base.hit_tokens:
            assert base.per_request is not None
            interval = paired_gain_interval(r.per_request, base.per_request)
            gain = r.hit_tokens / base.hit_tokens - 1.0
            gain_ci = None if interval is None else interval.to_list()
        out.append(CellFigures(r, hit_ratio_interval(r.per_request, prompt), gain, gain_ci))
    return out


@dataclass
class FleetOutcome:
    options: FleetOptions
    workloads: dict[int, dict[str, Any]]  # instance count -> its workload's summary
    cells: list[CellFigures]
    timings_s: dict[str, float]
    files: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "lpc_version": __version__,
            "instance_counts": list(self.options.instance_counts),
            "routers": list(self.options.routers),
            "policies": [p.label for p in self.options.ab.policies],
            "cache_sizes_tokens_per_instance": list(self.options.ab.cache_sizes_tokens or ()),
            "copies": self.options.copies or "instances",
            "executor": {
                "kind": self.options.executor.kind,
                "address": self.options.executor.address,
                "workers": self.options.executor.workers,
            },
            "workloads": {str(k): v for k, v in self.workloads.items()},
            "cells": [c.to_dict() for c in self.cells],
            "timings_s": self.timings_s,
            "files": self.files,
        }


def fleet_trace_for(options: FleetOptions, instances: int, log: Callable[[str], None]) -> Path:
    """The trace replayed at `instances` instances: the given one for one copy, else its
    k-copy fleet (`lpc.fleet.scale`), written into the output folder (every run: a file left
    by an earlier run may come from another source)."""
    trace = options.ab.trace
    assert trace is not None
    copies = options.copies or instances
    if copies == 1:
        return trace
    out = options.out_dir / f"fleet-trace-{Path(str(trace)).name.split('.')[0]}-x{copies}.jsonl.gz"
    write_scaled_trace(trace, copies, out)
    log(f"fleet: wrote {copies} copies of {trace} to {out}")
    return out


def fleet_workload_for(
    options: FleetOptions, instances: int, log: Callable[[str], None]
) -> ABOptions:
    """The workload at `instances` instances: a trace scaled to k copies, or a generated
    workload with k times the active conversations (k = --copies, else the instance count),
    so each instance carries one instance's load on average."""
    if options.ab.trace is not None:
        return replace(options.ab, trace=fleet_trace_for(options, instances, log))
    config = options.ab.workload
    copies = options.copies or instances
    return replace(
        options.ab,
        workload=replace(config, max_active_conversations=config.max_active_conversations * copies),
    )


def run_fleet(
    options: FleetOptions,
    model_factory: ModelSourceFactory | None = None,
    log: Callable[[str], None] = print,
) -> FleetOutcome:
    """Per instance count: its workload, then every router × policy × size cell."""
    from tqdm import tqdm

    started = time.perf_counter()
    timings: dict[str, float] = {}
    sizes = options.ab.cache_sizes_tokens or TRACE_CACHE_SIZES_TOKENS
    options.out_dir.mkdir(parents=True, exist_ok=True)
    cells_out: list[CellFigures] = []
    workloads: dict[int, dict[str, Any]] = {}
    workloads_memory: dict[int, dict[str, Any]] = {}
    for n in options.instance_counts:
        t0, t0_cpu = time.perf_counter(), time.process_time()
        ab = fleet_workload_for(options, n, log)
        prepared = prepare_workload(replace(ab, cache_sizes_tokens=sizes), model_factory, log)
        timings[f"workload_{n}_s"] = time.perf_counter() - t0
        timings[f"workload_{n}_cpu_s"] = time.process_time() - t0_cpu
        workloads[n] = prepared.summary
        workloads[n]["prepared_peak_rss_bytes"] = peak_rss_bytes()
        cells = [
            FleetCell(router, policy, n, size)
            for router in options.routers
            for policy in options.ab.policies
            for size in sizes
        ]
        t0 = time.perf_counter()
        with tqdm(
            total=len(cells), desc=f"{n} instances", unit="cell", disable=not options.progress
        ) as bar:
            peaks: dict[str, int] = {}
            results = run_cells(
                prepared.workload,
                prepared.settings,
                cells,
                options.executor,
                lambda _: bar.update(),
                peaks,
            )
        timings[f"replay_{n}_s"] = time.perf_counter() - t0
        # processor-seconds of the cells themselves, wherever they ran
        timings[f"replay_{n}_cells_cpu_s"] = sum(r.cpu_seconds for r in results)
        if peaks:
            workloads_memory[n] = {
                "workers": len(peaks),
                "peak_rss_bytes_per_worker": sorted(peaks.values()),
            }
        cells_out += figures(results, prepared.workload)
    timings["total_s"] = time.perf_counter() - started
    for n, memory in workloads_memory.items():
        workloads[n]["ray"] = memory
    outcome = FleetOutcome(options, workloads, cells_out, timings)
    write_files(outcome)
    return outcome


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}%"


def _ci(bounds: Sequence[float] | None, signed: bool = False) -> str:
    if bounds is None:
        return "–"
    fmt = "{:+.1f}" if signed else "{:.2f}"
    return f"[{fmt.format(100 * bounds[0])}, {fmt.format(100 * bounds[1])}]"


def _size(tokens: int) -> str:
    return f"{tokens / 1e6:g}M" if tokens >= 1_000_000 else f"{tokens / 1000:g}K"


TABLE_HEADER = (
    "instances",
    "size/inst",
    "router",
    "policy",
    "hit ratio [95 %]",
    "gain over lru [95 %]",
    "max/mean load",
    "TTFT p50 / p90 (s)",
)


def table_rows(cells: Sequence[CellFigures]) -> list[list[str]]:
    rows = []
    for c in cells:
        r = c.result
        gain = "–" if c.gain_over_lru is None else f"{100 * c.gain_over_lru:+.1f}%"
        rows.append(
            [
                str(r.instances),
                _size(r.cache_tokens),
                r.router,
                r.policy,
                f"{_pct(r.token_hit_ratio)} {_ci(c.hit_ratio_ci95)}",
                f"{gain} {_ci(c.gain_over_lru_ci95, signed=True)}" if gain != "–" else "–",
                f"{r.load_imbalance:.2f}",
                f"{r.ttft_p50_s:.3f} / {r.ttft_p90_s:.3f}",
            ]
        )
    return rows


def summary_text(outcome: FleetOutcome) -> str:
    rows = table_rows(outcome.cells)
    widths = [max(len(x) for x in col) for col in zip(TABLE_HEADER, *rows, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(TABLE_HEADER, widths, strict=True))]
    lines.append("-" * len(lines[0]))
    lines += ["  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def markdown_table(outcome: FleetOutcome) -> str:
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(outcome.cells)]
    return "\n".join(lines) + "\n"


def _atomic_write(path: Path, data: bytes) -> None:
    """Temporary file in the same folder, then a rename: never half a report."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def plot_fleet(path: Path, cells: Sequence[CellFigures]) -> None:
    """Hit ratio by router (groups) and policy (bars), one panel per instance count and size,
    95 % intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(c.result.instances, c.result.cache_tokens) for c in cells})
    routers = list(dict.fromkeys(c.result.router for c in cells))
    policies = list(dict.fromkeys(c.result.policy for c in cells))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    width = 0.8 / max(1, len(policies))
    for ax, (n, size) in zip(axes[0], panels, strict=True):
        for k, policy in enumerate(policies):
            xs, ys, lo, hi = [], [], [], []
            for j, router in enumerate(routers):
                cell = next(
                    (
                        c
                        for c in cells
                        if (c.result.instances, c.result.cache_tokens, c.result.router)
                        == (n, size, router)
                        and c.result.policy == policy
                    ),
                    None,
                )
                if cell is None:
                    continue
                ratio = 100 * cell.result.token_hit_ratio
                ci = cell.hit_ratio_ci95 or [cell.result.token_hit_ratio] * 2
                xs.append(j + (k - (len(policies) - 1) / 2) * width)
                ys.append(ratio)
                lo.append(ratio - 100 * ci[0])
                hi.append(100 * ci[1] - ratio)
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=policy)
        ax.set_xticks(range(len(routers)), routers, rotation=15)
        ax.set_title(f"{n} instance{'s' if n > 1 else ''}, {_size(size)} tokens each")
        ax.set_ylabel("fleet token hit ratio (%)")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    _atomic_write(path, buffer.getvalue())


def write_files(outcome: FleetOutcome) -> None:
    out = outcome.options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "json": out / "fleet.json",
        "csv": out / "fleet.csv",
        "markdown": out / "report.md",
        "plot": out / "fleet.png",
    }
    outcome.files = {k: str(v) for k, v in files.items()}
    _atomic_write(
        files["json"], (json.dumps(outcome.to_json(), indent=2, default=str) + "\n").encode()
    )
    rows = [c.to_dict() for c in outcome.cells]
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _atomic_write(files["csv"], buffer.getvalue().encode())
    _atomic_write(files["markdown"], ("# Fleet replay\n\n" + markdown_table(outcome)).encode())
    if outcome.cells:
        plot_fleet(files["plot"], outcome.cells)
