"""`lpc ab` end to end (`run_ab`): plan, then the replay loops (open loop over one prepared
workload, or closed loop per policy), the two-tier grid and the think-time sweep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from tqdm import tqdm

from lpc.errors import InvalidInputError
from lpc.replay.ab import ReplayConstants, compare, run_grid
from lpc.replay.ab_options import (
    DATASET_MAX_MODEL_LEN,
    TRACE_MAX_MODEL_LEN,
    ABOptions,
    ModelSourceFactory,
)
from lpc.replay.ab_plan import (
    LoadedInputs,
    ReplayWorkload,
    build_workload,
    dataset_context,
    load_inputs,
)
from lpc.replay.ab_report import ABOutcome, export_trace, write_files
from lpc.replay.ab_sources import Replayer, fit_policy_constants, fit_sources
from lpc.replay.fitted_policies import DEFAULT_TYPE, category_of
from lpc.replay.probability import ProbabilitySource
from lpc.replay.simulator import PreparedWorkload, ReplayResult, prepare, replay_closed_loop
from lpc.replay.two_tier import TierSettings, TwoTierResult
from lpc.replay.two_tier_grid import GridTiming, run_pair_grid
from lpc.replay.two_tier_intervals import versus_best
from lpc.traces.expand import check_block_size
from lpc.workload import ScriptedTurn, WorkloadConfig, WorkloadRequest, draw_scripts
from predictor.atomic_files import OutputWriteError, ResultsNotSavedError


def run_ab(
    options: ABOptions,
    model_factory: ModelSourceFactory | None = None,
    log: Callable[[str], None] = print,
) -> ABOutcome:
    """The whole replay, stage by stage: load → build workload → fit sources → replay grid
    (and the think-time sweep) → compare and report. Each stage is a function below; what
    several stages share travels in `LoadedInputs`, `ReplayWorkload` and `Replayer`."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    is_trace = options.trace is not None
    options = replace(
        options,
        max_model_len=options.max_model_len
        or (TRACE_MAX_MODEL_LEN if is_trace else DATASET_MAX_MODEL_LEN),
    )
    loaded = load_inputs(options, log)
    timings["load_s"] = time.perf_counter() - started

    context = dataset_context(loaded.dataset)
    t0 = time.perf_counter()
    work = build_workload(loaded, context, log)
    timings["workload_s"] = time.perf_counter() - t0

    replayer = fit_sources(work, context, model_factory)
    t0 = time.perf_counter()
    fit_policy_constants(loaded, work, context, replayer)
    if replayer.fits.report:
        timings["fit_policies_s"] = time.perf_counter() - t0
    files: dict[str, str] = {}
    unsaved: list[OutputWriteError] = []  # files that could not be written, the run goes on
    two_tier: list[TwoTierResult] = []
    if work.options.workload.latency.closed_loop:
        if work.options.tiers is not None:
            raise InvalidInputError("--offload-sizes replays a fixed timeline, not --closed-loop")
        results, summary = _replay_closed_loop(loaded, work, replayer, timings)
    else:
        results, summary = _replay_open_loop(work, replayer, files, timings, log, two_tier, unsaved)
    sweep, sweep_scales = _think_time_sweep(loaded, replayer, timings)

    comparison = compare(results)
    if sweep_scales:
        summary["sweep_scale_per_s"] = {str(k): v for k, v in sweep_scales.items()}
    if replayer.sweep_fits:
        summary["sweep_fitted_policies"] = {str(k): v for k, v in replayer.sweep_fits.items()}
    versus: list[dict[str, Any]] = []
    if two_tier and work.options.tiers is not None:
        t0 = time.perf_counter()
        versus = versus_best(two_tier, work.options.tiers.latency)
        timings["two_tier_intervals_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - started
    outcome = ABOutcome(
        work.options, summary, results, comparison, sweep, timings, files, two_tier, versus
    )
    failed = unsaved + write_files(outcome, work.options.out_dir)
    if failed:  # the outcome travels with the error: the command still prints the figures
        raise ResultsNotSavedError(outcome, failed, list(outcome.files.values()))
    return outcome


def _replay_closed_loop(
    loaded: LoadedInputs, work: ReplayWorkload, replayer: Replayer, timings: dict[str, float]
) -> tuple[list[ReplayResult], dict[str, Any]]:
    """Stage 4, closed loop: each policy replays its own timeline from the scripts."""
    options = work.options
    if loaded.dataset is None:
        raise InvalidInputError(
            "a closed-loop replay generates its timeline: it cannot replay --trace"
        )
    # A closed loop has no fixed timeline: the decay scale reads the think times of the same
    # scripts replayed open loop.
    latency = replace(options.workload.latency, closed_loop=False)
    open_loop = replace(options.workload, latency=latency)
    settings = replayer.settings_for(loaded.generated_requests(open_loop))
    results = _closed_loop_grid(
        options, lambda: loaded.scripts(options.workload), replayer.sources, settings
    )
    summary: dict[str, Any] = {"source": work.source_desc, "closed_loop": True}
    if replayer.fits.report:
        summary["fitted_policies"] = replayer.fits.report
    if work.no_training_part is not None:
        summary["no_training_part"] = work.no_training_part
    summary["scale_per_s"] = settings.scale_per_s
    timings["predict_s"] = 0.0
    return results, summary


def _replay_open_loop(
    work: ReplayWorkload,
    replayer: Replayer,
    files: dict[str, str],
    timings: dict[str, float],
    log: Callable[[str], None],
    two_tier: list[TwoTierResult],
    unsaved: list[OutputWriteError],
) -> tuple[list[ReplayResult], dict[str, Any]]:
    """Stage 4: predict every request once, then replay the grid (every policy at every
    cache size) on the one prepared workload; with --offload-sizes also every GPU × CPU
    policy pair at every pair of sizes, appended to `two_tier`."""
    options, requests = work.options, work.requests
    t0 = time.perf_counter()
    values = replayer.predictions(requests)
    timings["predict_s"] = time.perf_counter() - t0
    if options.export_trace is not None:
        try:
            export_trace(work, values, files, log)
        except OutputWriteError as error:  # the replay's figures are worth more than it
            log(f"trace: {error}; the replay goes on")
            unsaved.append(error)
    assert options.block_size is not None
    if work.trace_info and work.trace_block_size:
        check_block_size(options.block_size, work.trace_block_size)
    curves = replayer.curves(requests)
    timings["predict_s"] = time.perf_counter() - t0
    workload = prepare(
        requests,
        options.block_size,
        values,
        first_counted=work.first_counted,
        categories=replayer.categories(requests),
        curves=curves,
    )
    settings = replayer.settings_for(requests)
    summary = workload_summary(workload, requests, options, work.source_desc)
    if replayer.fits.report:
        summary["fitted_policies"] = replayer.fits.report
    if work.trace_info:
        summary["trace"] = work.trace_info
        _check_sizes(options, summary["peak_in_flight_tokens"], log)
    if work.no_training_part is not None:
        summary["no_training_part"] = work.no_training_part
    log(
        f"workload: {summary['requests']} requests from "
        f"{summary['conversations']} conversations, "
        f"{summary['prompt_tokens']:,} prompt tokens over {summary['span_s']:.0f} s"
        + (" (counted: the evaluation part)" if work.first_counted else "")
        + f"; peak in flight {summary['peak_in_flight_tokens']:,} tokens"
    )
    summary["scale_per_s"] = settings.scale_per_s
    t0 = time.perf_counter()
    results = _grid(workload, options, settings, "replaying")
    timings["replay_s"] = time.perf_counter() - t0
    if options.tiers is not None:
        t0 = time.perf_counter()
        grid, grid_timing = _two_tier_grid(workload, options, options.tiers, settings)
        two_tier += grid
        timings["two_tier_replay_s"] = time.perf_counter() - t0
        # processor seconds of the grid's GPU replays and CPU-tier passes, all workers together
        timings["two_tier_gpu_replays_cpu_s"] = grid_timing.gpu_replay_cpu_s
        timings["two_tier_cpu_tier_replays_cpu_s"] = grid_timing.host_replay_cpu_s
    return results, summary


def _two_tier_grid(
    workload: PreparedWorkload, options: ABOptions, tiers: TierSettings, settings: ReplayConstants
) -> tuple[list[TwoTierResult], GridTiming]:
    """Every GPU × CPU policy pair at every pair of sizes (`two_tier_grid.run_pair_grid`: one
    GPU replay per GPU policy and size, in `--workers` processes)."""
    assert options.cache_sizes_tokens is not None
    total = (
        len(options.policies)
        * len(tiers.offload_policies)
        * len(options.cache_sizes_tokens)
        * len(tiers.offload_sizes_tokens)
    )
    with tqdm(total=total, desc="two tiers", unit="run", disable=not options.progress) as bar:
        return run_pair_grid(
            workload,
            options.policies,
            options.cache_sizes_tokens,
            tiers,
            settings,
            options.workers,
            lambda _: bar.update(),
        )


def _think_time_sweep(
    loaded: LoadedInputs, replayer: Replayer, timings: dict[str, float]
) -> tuple[dict[float, list[ReplayResult]], dict[float, float]]:
    """Stage 5 (optional): a generated workload per mean think time, replayed at the sweep's
    one cache size; also each workload's estimated decay scale."""
    options = replayer.options
    sweep: dict[float, list[ReplayResult]] = {}
    sweep_scales: dict[float, float] = {}
    if not options.think_time_sweep_s:
        return sweep, sweep_scales
    if loaded.dataset is None or options.trace is not None:
        raise InvalidInputError("a think-time sweep generates workloads: it cannot run on --trace")
    assert options.block_size is not None
    t0 = time.perf_counter()
    for mean in options.think_time_sweep_s:
        config = WorkloadConfig(
            mean,
            options.workload.max_active_conversations,
            options.workload.duration_s,
            options.workload.seed,
            options.workload.latency,
        )
        reqs = loaded.generated_requests(config)
        workload = prepare(
            reqs,
            options.block_size,
            replayer.predictions(reqs),
            categories=replayer.categories(reqs),
            curves=replayer.curves(reqs),
        )
        fits = replayer.refit(config) if replayer.refit is not None else None
        settings = replayer.settings_for(reqs, fits)
        if fits is not None:
            replayer.sweep_fits[mean] = fits.report
        sweep_scales[mean] = settings.scale_per_s
        sizes = (options.sweep_cache_tokens,)
        sweep[mean] = _grid(workload, options, settings, f"λ={mean:g}s", sizes=sizes)
    timings["sweep_s"] = time.perf_counter() - t0
    return sweep, sweep_scales


def _grid(
    workload: PreparedWorkload,
    options: ABOptions,
    settings: ReplayConstants,
    desc: str,
    sizes: Sequence[int] | None = None,
) -> list[ReplayResult]:
    sizes = tuple(sizes or options.cache_sizes_tokens)
    total = len(options.policies) * len(sizes)
    with tqdm(total=total, desc=desc, unit="run", disable=not options.progress) as bar:
        return run_grid(
            workload, options.policies, sizes, settings, options.workers, lambda _: bar.update()
        )


def _closed_loop_grid(
    options: ABOptions,
    conversations: Callable[[], Iterator[list[ScriptedTurn]]],
    sources: dict[str, ProbabilitySource],
    settings: ReplayConstants,
) -> list[ReplayResult]:
    """Each policy builds its own timeline, so each replays the scripts from the start."""
    cache: dict[tuple[str, int], dict[str, float | None]] = {}

    def probability_of(source: str) -> Callable[[ScriptedTurn], float | None]:
        def lookup(turn: ScriptedTurn) -> float | None:
            key = (turn.conversation_id, turn.turn_index)
            if key not in cache:
                cache[key] = {name: s.predict([turn])[0] for name, s in sources.items()}
            return cache[key].get(source)

        return lookup

    results = []
    jobs = [(p, s) for p in options.policies for s in options.cache_sizes_tokens]
    for spec, size in tqdm(jobs, desc="closed loop", unit="run", disable=not options.progress):
        results.append(
            replay_closed_loop(
                draw_scripts(conversations(), options.workload),
                options.workload,
                spec,
                size,
                options.block_size,
                probability_of(spec.source or ""),
                settings.scale_per_s,
                settings.fallback_probability,
                policy_options=settings.policy_options.get(spec.evictor),
                category_of=lambda turn: category_of(DEFAULT_TYPE, turn.turn_index),
            )
        )
    return results


def _check_sizes(options: ABOptions, peak_in_flight: int, log: Callable[[str], None]) -> None:
    """Warn about cache sizes below twice the peak in-flight tokens: there the running
    requests alone fill the cache, and allocation failures, not eviction, set the hit ratio."""
    small = [s for s in options.cache_sizes_tokens or () if s < 2 * peak_in_flight]
    if small:
        log(
            f"warning: cache sizes {', '.join(f'{s:,}' for s in small)} are below twice the "
            f"peak in-flight tokens ({peak_in_flight:,}): requests in flight fill them"
        )


def workload_summary(
    workload: PreparedWorkload, requests: list[WorkloadRequest], options: ABOptions, source: str
) -> dict[str, Any]:
    # The span of the trace itself: arrivals may be epoch timestamps, not seconds from 0.
    start = min((r.arrival_s for r in requests), default=0.0)
    span = max((r.completion_s for r in requests), default=0.0) - start
    counted = requests[workload.first_counted :]
    return {
        "source": source,
        "requests": len(counted),
        "conversations": len({r.conversation_id for r in counted}),
        "prompt_tokens": workload.num_prompt_tokens,
        "replayed_requests": len(requests),
        "peak_in_flight_tokens": workload.peak_in_flight_tokens,
        "span_s": span,
        "mean_think_time_s": options.workload.mean_think_time_s,
        "max_active_conversations": options.workload.max_active_conversations,
        "duration_s": options.workload.duration_s,
        "seed": options.workload.seed,
        "block_size": options.block_size,
        "max_model_len": options.max_model_len,
        "closed_loop": False,
    }
