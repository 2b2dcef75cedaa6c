"""`lpc ab` end to end: data → workload → predictions → replays → comparisons → files.

The CLI parses flags into `ABOptions`; everything else happens here, so the whole pipeline is
also a library call (`run_ab(options)`), e.g. for notebooks and tests.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from eviction import POLICIES
from eviction.lpc import DEFAULT_FALLBACK_PROBABILITY
from lpc import __version__
from lpc.blocks.hashing import BlockHasher
from lpc.errors import InvalidInputError
from lpc.replay.ab import (
    DEFAULT_CACHE_SIZES_TOKENS,
    TRACE_CACHE_SIZES_TOKENS,
    Comparison,
    ReplaySettings,
    compare,
    run_grid,
)
from lpc.replay.fitted_policies import (
    DEFAULT_TYPE,
    PolicyFits,
    category_of,
    fit_policies,
    request_categories,
)
from lpc.replay.policies import DEFAULT_POLICIES, PolicySpec, parse_policies
from lpc.replay.probability import OracleSource, ProbabilitySource, TurnsSource
from lpc.replay.report import (
    comparison_tables,
    markdown_table,
    plot_hit_vs_size,
    plot_hit_vs_think_time,
    sweep_table,
    terminal_report,
    text_table,
    write_csv,
    write_json,
)
from lpc.replay.simulator import (
    PreparedWorkload,
    ReplayResult,
    hash_turns,
    prepare,
    replay_closed_loop,
)
from lpc.replay.two_tier import TierSettings, TwoTierResult
from lpc.replay.two_tier_grid import GridTiming, run_pair_grid
from lpc.replay.two_tier_intervals import versus_best, versus_best_text
from lpc.replay.two_tier_report import (
    TABLE_HEADER,
    plot_two_tier,
    two_tier_json,
    two_tier_rows,
    write_two_tier_csv,
)
from lpc.traces.expand import check_block_size
from lpc.traces.linkage import DEFAULT_SHARED_FANOUT
from lpc.traces.timeline import DEFAULT_HORIZON_S, DEFAULT_SPLIT_AT
from lpc.workload import (
    ScriptedTurn,
    WorkloadConfig,
    WorkloadRequest,
    draw_scripts,
    estimated_scale_per_s,
    open_loop_requests,
)
from predictor.atomic_files import OutputWriteError, ResultsNotSavedError, write_text_atomically
from training.conversation import Conversation

if TYPE_CHECKING:
    from lpc.chat.conversation_workload import SplitDataset
    from lpc.chat.tokenizers import ChatTokenizer
    from lpc.traces.load import LoadedTrace
    from lpc.traces.timeline import TimeSplit

DATASET_MAX_MODEL_LEN = 32768
# Production traces come from long-context models (Kimi serves 128K); a longer prompt is cut.
TRACE_MAX_MODEL_LEN = 131072

# source name -> builds a source once the training half is known
ModelSourceFactory = Callable[["ABContext"], ProbabilitySource]


@dataclass(frozen=True)
class ABOptions:
    dataset: str = "sharegpt"
    data_format: str | None = None
    mode: str | None = None
    trace: Path | None = None  # a file, or the name of a bundled trace ("mooncake")
    trace_format: str | None = None  # None: recognised from the first line
    split_at: float | None = None  # traces: fraction (< 1) or seconds; None: 0.5
    # traces: seconds after the first arrival at which the replay stops (a prequential
    # window's end: requests arriving at or after it are not replayed); None: the trace's end
    replay_until_s: float | None = None
    horizon_s: float = DEFAULT_HORIZON_S  # traces: the oracle's continuation horizon
    shared_fanout: int = DEFAULT_SHARED_FANOUT  # traces: prefix linkage's shared-block fan-out
    policies: tuple[PolicySpec, ...] = field(
        default_factory=lambda: tuple(parse_policies(",".join(DEFAULT_POLICIES)))
    )
    # None: DEFAULT_CACHE_SIZES_TOKENS, or TRACE_CACHE_SIZES_TOKENS for a trace
    cache_sizes_tokens: tuple[int, ...] | None = None
    block_size: int | None = None  # None: 16, or an imported trace's own block size
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    max_model_len: int | None = None  # None: 32768, or TRACE_MAX_MODEL_LEN for a trace
    scale_per_s: float | None = None  # None: estimated from the workload's think times
    fallback_probability: float | None = None  # None: the training half's continuation rate
    think_time_sweep_s: tuple[float, ...] = ()
    sweep_cache_tokens: int = 160_000
    export_trace: Path | None = None
    trace_probabilities: str | None = None
    # The policies are the defaults, not the user's list: one that needs a training part
    # is left out (and the report says so) when there is none, instead of refused.
    policies_by_default: bool = False
    # False for an access-feature model: it needs no chat data set on a trace
    model_reads_text: bool = True
    out_dir: Path = Path("results/ab")
    workers: int = 2
    progress: bool = True
    tiers: TierSettings | None = None  # --offload-sizes: a CPU tier below the GPU cache
    # the return-time artifact `lpc-return-model` reads (None: the shipped one)
    return_model: Path | None = None
    # what its curves assume beyond their grid (predictor.return_time.TAILS)
    return_tail: str = "flat"

    @property
    def replayed_policies(self) -> tuple[PolicySpec, ...]:
        """The GPU tier's policies and the CPU tier's: the probability sources serve both."""
        return self.policies + (self.tiers.offload_policies if self.tiers else ())


@dataclass
class ABContext:
    """What the pipeline learned before replaying: shared with probability-source factories."""

    train_turn_counts: list[int]
    base_rate: float
    load_summary: str = ""
    eval_conversations: list[Conversation] = field(default_factory=list)  # for model sources
    request_types: dict[str, str] | None = None  # trace request id -> Bailian type


@dataclass
class ABOutcome:
    options: ABOptions
    workload_summary: dict[str, Any]
    results: list[ReplayResult]
    comparison: Comparison
    sweep: dict[float, list[ReplayResult]]
    timings_s: dict[str, float]
    files: dict[str, str]
    two_tier: list[TwoTierResult] = field(default_factory=list)
    # LPC in both tiers against the best other pair, with intervals (`two_tier_intervals`)
    two_tier_versus_best: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "lpc_version": __version__,
            "workload": self.workload_summary,
            "settings": {
                "policies": [p.label for p in self.options.policies],
                "cache_sizes_tokens": list(self.options.cache_sizes_tokens),
                "block_size": self.options.block_size,
                "max_model_len": self.options.max_model_len,
                "scale_per_s": self.options.scale_per_s or "auto",
                "think_time_sweep_s": list(self.options.think_time_sweep_s),
                "sweep_cache_tokens": self.options.sweep_cache_tokens,
            },
            "results": [r.to_dict() for r in self.results],
            "comparison": {
                "hit_ratio": self.comparison.hit_ratio,
                "gain_over_lru": self.comparison.gain_over_lru,
                "gap_closed": self.comparison.gap_closed,
                "gap_closed_belady": self.comparison.gap_closed_belady,
                "size_for_lru_ratio": self.comparison.size_for_lru_ratio,
                "gain_over_lru_ci95": self.comparison.gain_over_lru_ci95,
            },
            "think_time_sweep": {str(k): [r.to_dict() for r in v] for k, v in self.sweep.items()},
            "timings_s": self.timings_s,
            "files": self.files,
        }
        if self.options.tiers is not None:
            out["two_tier"] = two_tier_json(self.options.tiers, self.two_tier)
            out["two_tier"]["versus_best"] = self.two_tier_versus_best
        return out


def _sources_needed(policies: Sequence[PolicySpec], extra: str | None) -> set[str]:
    names = {p.source for p in policies if p.source not in (None, "const")}
    if extra:
        names.add(extra)
    return names  # type: ignore[return-value]


def _build_sources(
    names: set[str], context: ABContext, model_factory: ModelSourceFactory | None
) -> dict[str, ProbabilitySource]:
    sources: dict[str, ProbabilitySource] = {}
    for name in sorted(names):
        if name == "oracle":
            sources[name] = OracleSource()
        elif name == "turns":
            sources[name] = TurnsSource.fit(context.train_turn_counts)
        elif name == "model":
            if model_factory is None:
                raise InvalidInputError(
                    "policy 'lpc' needs a trained predictor model (--model PATH)"
                )
            sources[name] = model_factory(context)
        elif name == "trace":
            continue  # filled from the trace's logged probabilities
        else:
            raise ValueError(f"unknown probability source {name!r}")
    return sources


def run_ab(
    options: ABOptions,
    model_factory: ModelSourceFactory | None = None,
    log: Callable[[str], None] = print,
) -> ABOutcome:
    """The whole replay, stage by stage: load → build workload → fit sources → replay grid
    (and the think-time sweep) → compare and report. Each stage is a function below; what
    several stages share travels in `_Loaded`, `_Workload` and `_Replayer`."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    is_trace = options.trace is not None
    options = replace(
        options,
        max_model_len=options.max_model_len
        or (TRACE_MAX_MODEL_LEN if is_trace else DATASET_MAX_MODEL_LEN),
    )
    loaded = _load(options, log)
    timings["load_s"] = time.perf_counter() - started

    context = _dataset_context(loaded.dataset)
    t0 = time.perf_counter()
    work = _build_workload(loaded, context, log)
    timings["workload_s"] = time.perf_counter() - t0

    replayer = _fit_sources(work, context, model_factory)
    t0 = time.perf_counter()
    _fit_policies(loaded, work, context, replayer)
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
    failed = unsaved + _write_files(outcome, work.options.out_dir)
    if failed:  # the outcome travels with the error: the command still prints the figures
        raise ResultsNotSavedError(outcome, failed, list(outcome.files.values()))
    return outcome


@dataclass
class _Loaded:
    """The load stage's result: options with the model length resolved, the chat data set
    (None on a trace that needs none) and the tokenizer the later stages share."""

    options: ABOptions
    dataset: SplitDataset | None
    tokenizer: ChatTokenizer
    # a trace split after its start: its own training part fits turns and the fallback
    trace_has_training_part: bool
    no_training_part: dict[str, Any] | None = None  # the data set's training half is empty

    def scripts(self, config: WorkloadConfig) -> Iterator[list[ScriptedTurn]]:
        """The evaluation half as scripted conversations, in the order `config.seed` draws."""
        from lpc.chat.conversation_workload import scripted_conversations

        assert self.dataset is not None
        return scripted_conversations(
            self.dataset.eval,
            self.tokenizer,
            config.seed,
            self.options.max_model_len,
            self.options.progress,
        )

    def training_requests(self, config: WorkloadConfig) -> list[WorkloadRequest]:
        """The training half placed in time by the same generator (its open-loop timeline):
        what the fitted policies learn from on a generated workload."""
        from lpc.chat.conversation_workload import scripted_conversations

        assert self.dataset is not None
        scripts = scripted_conversations(
            self.dataset.train,
            self.tokenizer,
            config.seed,
            self.options.max_model_len,
            self.options.progress,
        )
        open_loop = replace(config, latency=replace(config.latency, closed_loop=False))
        return open_loop_requests(scripts, open_loop)

    def generated_requests(self, config: WorkloadConfig) -> list[WorkloadRequest]:
        """The open-loop timeline; a window too short for any arrival is refused, not
        replayed as zero hits out of zero."""
        requests = open_loop_requests(self.scripts(config), config)
        if not requests:
            where = (
                "; give more conversations"
                if config.duration_s is None
                else f" in the {config.duration_s:g} s window; give a longer --duration"
            )
            raise InvalidInputError(f"{self.options.dataset}: no request arrives{where}")
        return requests


def _load(options: ABOptions, log: Callable[[str], None]) -> _Loaded:
    """Stage 1: the chat data set, loaded only when something reads it (a generated workload;
    on a trace, a fit the trace cannot make). A trace the requested predictor cannot read
    fails first, before minutes of loading."""
    from lpc.chat.conversation_workload import load_split
    from lpc.chat.tokenizers import default_chat_tokenizer

    if options.trace is not None:
        _check_trace_readable(options)
        if options.split_at == 0:
            _refuse_fitted_without_training_part(options)
    tokenizer = default_chat_tokenizer()
    needed = _sources_needed(options.replayed_policies, options.trace_probabilities)
    needs_train = bool(needed - {"oracle", "trace"}) or options.fallback_probability is None
    trace_has_training_part = options.trace is not None and options.split_at != 0
    if trace_has_training_part:
        # A trace's own training part fits turns and the fallback; only a learned model
        # needs the chat data set (its evaluation conversations). A trace split at 0 has no
        # training part: the data set's training half fits them, as for generated workloads.
        needs_train = options.model_reads_text and "model" in needed
    dataset = None
    if options.trace is None or needs_train:
        dataset = load_split(options.dataset, options.data_format, options.mode)
        log(
            f"data: {'; '.join(dataset.load_summary.splitlines())}; "
            f"split {len(dataset.train)} train / {len(dataset.eval)} evaluation"
        )
        if options.trace is None and not dataset.eval:
            raise InvalidInputError(
                f"{options.dataset}: all {len(dataset.train)} conversations fall in the training "
                "half, none in the evaluation half the replay uses; give more conversations"
            )
    loaded = _Loaded(options, dataset, tokenizer, trace_has_training_part)
    if dataset is not None and not trace_has_training_part:
        loaded.options, loaded.no_training_part = _check_training_half(options, dataset, log)
    return loaded


def _check_training_half(
    options: ABOptions, dataset: SplitDataset, log: Callable[[str], None]
) -> tuple[ABOptions, dict[str, Any] | None]:
    """The data set's training half fits turns and the fallback here. When the split puts
    no conversation in it, a policy the user asked for that needs the fit is refused, saying
    what to do (a default one is left out); the others replay unfitted, and the returned note
    tells the report so."""
    if any(c.num_user_turns for c in dataset.train):
        return options, None
    options, left_out = _without_unfittable_defaults(options)
    fitted = _needs_fit(options)
    if fitted:
        raise InvalidInputError(
            f"{options.dataset}: no conversation falls in the training half "
            f"({len(dataset.eval)} in the evaluation half), which {fitted} is fitted on; "
            "give more conversations, or leave it out"
        )
    note = _no_training_part_note(options, "no conversation falls in the training half", left_out)
    log(f"data: {_no_training_part_text(note)}")
    return options, note


def _is_fitted(spec: PolicySpec) -> bool:
    """lpc-turns, and the policies whose constants are fitted (`wa`, `session-ref`)."""
    return spec.source == "turns" or POLICIES[spec.evictor].kind == "fitted"


def _without_unfittable_defaults(options: ABOptions) -> tuple[ABOptions, list[str]]:
    """Default policies that need a training part (lpc-turns) left out, with their labels;
    a list the user gave is kept as it is (and refused if it needs the fit)."""
    if not options.policies_by_default:
        return options, []
    kept = tuple(p for p in options.policies if not _is_fitted(p))
    left_out = [p.label for p in options.policies if _is_fitted(p)]
    return replace(options, policies=kept), left_out


def _needs_fit(options: ABOptions) -> str:
    """What a training part must fit: lpc-turns, wa, session-ref (and --trace-probabilities
    turns); "" when nothing requested needs it."""
    fitted = [p.label for p in options.policies if _is_fitted(p)]
    if options.trace_probabilities == "turns":
        fitted.append("--trace-probabilities turns")
    return " and ".join(fitted)


def _no_training_part_note(
    options: ABOptions, reason: str, left_out: Sequence[str] = ()
) -> dict[str, Any]:
    """The report's note on an empty training part: why, the default policies left out for
    want of a fit, and the unfitted fallback p when a requested source can leave a request
    without a prediction (a model, a trace's log)."""
    note: dict[str, Any] = {"reason": reason}
    if left_out:
        note["left_out"] = list(left_out)
    needed = _sources_needed(options.replayed_policies, options.trace_probabilities)
    gaps = needed & {"model", "trace"}
    if options.fallback_probability is None and gaps:
        note["fallback_probability"] = DEFAULT_FALLBACK_PROBABILITY
    return note


def _no_training_part_text(note: dict[str, Any]) -> str:
    """The note in words (log lines and reports)."""
    text = f"no training part ({note['reason']}): nothing is fitted"
    if note.get("left_out"):
        text += f"; {', '.join(note['left_out'])} left out (it needs a training part)"
    if "fallback_probability" in note:
        text += (
            f"; LPC's fallback p is {note['fallback_probability']:g}, not fitted "
            "(--fallback-p sets it)"
        )
    return text


def _check_trace_readable(options: ABOptions) -> None:
    """A missing file, or the learned model on a trace without text, fails before any data
    set is loaded."""
    from lpc.traces.load import trace_format_of

    assert options.trace is not None
    fmt = trace_format_of(options.trace, options.trace_format)
    if (
        fmt != "lpc"
        and options.model_reads_text
        and "model" in _sources_needed(options.replayed_policies, options.trace_probabilities)
    ):
        raise InvalidInputError(
            f"the learned predictor reads user prompts; a {fmt} trace has no text "
            "(use lpc-turns, or an lpc trace in chat form)"
        )


def _dataset_context(dataset: SplitDataset | None) -> ABContext:
    """What the data set's training half fits: turn counts and the continuation rate (LPC's
    default fallback p). A trace with a training part refits both on it later."""
    train_counts = [c.num_user_turns for c in dataset.train if c.num_user_turns] if dataset else []
    base_rate = (
        TurnsSource.fit(train_counts).base_rate if train_counts else DEFAULT_FALLBACK_PROBABILITY
    )
    return ABContext(
        train_counts,
        base_rate,
        dataset.load_summary if dataset else "",
        dataset.eval if dataset else [],
    )


@dataclass
class _Workload:
    """The requests every policy replays, with the options they resolve (block size, cache
    sizes) and what a trace says about them."""

    options: ABOptions
    requests: list[WorkloadRequest]
    source_desc: str
    first_counted: int = 0  # requests before it warm the cache (a trace's training part)
    logged: list[float | None] | None = None  # a trace's own 'probability' per request
    trace_info: dict[str, Any] = field(default_factory=dict)  # empty for a generated workload
    trace_block_size: int | None = None
    no_training_part: dict[str, Any] | None = None  # nothing fitted: why (for the report)


def _build_workload(loaded: _Loaded, context: ABContext, log: Callable[[str], None]) -> _Workload:
    """Stage 2: the requests to replay, from the trace or generated from the evaluation half
    (a closed loop generates its own per policy, later). A trace also refits `context`."""
    options = loaded.options
    if options.trace is not None:
        work = _trace_workload(loaded, context, log)
    else:
        closed_loop = options.workload.latency.closed_loop
        requests = [] if closed_loop else loaded.generated_requests(options.workload)
        work = _Workload(options, requests, f"{options.dataset} evaluation half")
    work.options = replace(
        work.options,
        block_size=work.options.block_size or 16,
        cache_sizes_tokens=work.options.cache_sizes_tokens or DEFAULT_CACHE_SIZES_TOKENS,
    )
    work.no_training_part = work.no_training_part or loaded.no_training_part
    return work


def _trace_workload(loaded: _Loaded, context: ABContext, log: Callable[[str], None]) -> _Workload:
    """A trace's requests, split in time; its training part (when the split leaves it one)
    fits the turns source and the fallback in `context`, as the data set's training half
    does for a generated workload."""
    from lpc.chat.conversation_workload import message_tokenizer
    from lpc.traces.load import TraceOptions, load_trace
    from lpc.traces.timeline import split_in_time

    options = loaded.options
    assert options.trace is not None and options.max_model_len is not None
    trace_options = TraceOptions(
        options.trace_format,
        options.workload.latency,
        options.horizon_s,
        options.max_model_len,
        options.shared_fanout,
    )
    trace = load_trace(options.trace, trace_options, message_tokenizer(loaded.tokenizer))
    requests = trace.requests
    options = replace(
        options,
        block_size=options.block_size or trace.trace_block_size or 16,
        cache_sizes_tokens=options.cache_sizes_tokens or TRACE_CACHE_SIZES_TOKENS,
    )
    split = split_in_time(
        requests, DEFAULT_SPLIT_AT if options.split_at is None else options.split_at
    )
    logged = trace.logged_probabilities
    if options.replay_until_s is not None:
        split, kept = _replay_until(requests, split, options.replay_until_s)
        requests = requests[:kept]
        logged = None if logged is None else logged[:kept]
    trace_info = {**trace.info, "split": split.to_dict()}
    if options.replay_until_s is not None:
        trace_info["split"]["replay_until_s"] = options.replay_until_s
    note = None
    if loaded.trace_has_training_part:
        options, note = _fit_on_training_part(trace, split, options, context)
    if trace.request_types is not None:
        context.request_types = {
            r.request_id: t for r, t in zip(trace.requests, trace.request_types, strict=True)
        }
    _log_trace(trace, split, options, log)
    if note is not None:
        log(f"trace: {_no_training_part_text(note)}")
    return _Workload(
        options,
        requests,
        f"{trace.format} trace {trace.path}",
        split.first_eval,
        logged,
        trace_info,
        trace.trace_block_size,
        note,
    )


def _replay_until(
    requests: Sequence[WorkloadRequest], split: TimeSplit, until_s: float
) -> tuple[TimeSplit, int]:
    """The split of a replay that stops `until_s` seconds after the first arrival, and how
    many requests (in arrival order) it keeps: the evaluation part becomes [cut, until)."""
    from lpc.traces.timeline import TimeSplit

    end_s = split.start_s + until_s
    if end_s <= split.cut_s:
        raise InvalidInputError(
            f"the replay's end ({until_s:g} s after the first arrival) must lie after the "
            f"split ({split.cut_s - split.start_s:g} s)"
        )
    kept = next((i for i, r in enumerate(requests) if r.arrival_s >= end_s), len(requests))
    if kept == split.first_eval:
        raise InvalidInputError(
            f"no request arrives between the split ({split.cut_s - split.start_s:g} s) and "
            f"the replay's end ({until_s:g} s)"
        )
    return TimeSplit(split.cut_s, split.first_eval, kept, split.start_s), kept


def _fit_on_training_part(
    trace: LoadedTrace, split: TimeSplit, options: ABOptions, context: ABContext
) -> tuple[ABOptions, dict[str, Any] | None]:
    """Fit turns and the continuation rate on the trace's training part. The part is empty
    when every request arrives at one instant (the cut falls on the first arrival): then a
    policy the user asked for that needs the fit is refused, saying what to do, as `--split-at`
    itself refuses a split with nothing to evaluate (a default one is left out); the others
    replay unfitted, and the returned note tells the report so."""
    from lpc.traces.timeline import training_turn_counts

    counts = training_turn_counts(trace.requests, split)
    if counts:
        context.train_turn_counts, context.base_rate = counts, TurnsSource.fit(counts).base_rate
        return options, None
    reason = _why_no_training_part(trace.requests, split)
    options, left_out = _without_unfittable_defaults(options)
    fitted = _needs_fit(options)
    if fitted:
        split_at = DEFAULT_SPLIT_AT if options.split_at is None else options.split_at
        raise InvalidInputError(
            f"{trace.path}: {reason}, so the time split (--split-at {split_at:g}) leaves no "
            f"training part to fit {fitted} on; give --split-at 0 to fit it on the --dataset "
            "training half instead, or leave it out"
        )
    # A text model's data set may be loaded, but the trace's own part is the one that fits.
    context.train_turn_counts, context.base_rate = [], DEFAULT_FALLBACK_PROBABILITY
    return options, _no_training_part_note(options, reason, left_out)


def _why_no_training_part(requests: Sequence[WorkloadRequest], split: TimeSplit) -> str:
    if len(requests) == 1:
        return "the trace holds one request"
    if requests[0].arrival_s == requests[-1].arrival_s:
        return f"all {len(requests)} requests arrive at the same instant"
    return f"no request arrives before the cut at {split.cut_s - split.start_s:g} s"


def _log_trace(
    trace: LoadedTrace, split: TimeSplit, options: ABOptions, log: Callable[[str], None]
) -> None:
    """What the import did to the trace, one line each, then where the split fell."""
    for cut_file in trace.info.get("cut_last_line_files", []):
        log(f"trace: skipped 1 cut last line in {cut_file}")
    if trace.info.get("cut_to_max_model_len"):
        log(
            f"trace: cut {trace.info['cut_to_max_model_len']} requests longer than "
            f"--max-model-len {options.max_model_len} tokens"
        )
    if "linkage" in trace.info:
        link = trace.info["linkage"]
        log(
            f"trace: prefix linkage joined {link['linked_requests']} of "
            f"{link['requests']} requests into {link['conversations']} conversations "
            f"({link['multi_turn_conversations']} with several turns)"
        )
    if "request_log" in trace.info:
        engine = trace.info["request_log"]
        log(
            f"trace: request log of {engine['requests']} requests in {engine['files']} "
            f"file(s); the engine's own token hit ratio "
            f"{engine['engine_token_hit_ratio']:.2%}"
        )
    log(
        f"trace: training part {split.train_requests} requests before "
        f"{split.cut_s - split.start_s:.0f} s, evaluation part "
        f"{split.eval_requests} requests (hit ratios count these)"
    )


@dataclass
class _Replayer:
    """The fitted probability sources and the settings every replay of the workload (and of
    the sweep's workloads) shares."""

    options: ABOptions
    sources: dict[str, ProbabilitySource]
    names: set[str]
    logged: list[float | None] | None
    fallback: float
    first_counted: int
    request_types: dict[str, str] | None = None  # a trace's request types (Bailian)
    fits: PolicyFits = field(default_factory=PolicyFits)  # the fitted policies' constants
    # a generated workload's fit for another workload configuration (the think-time sweep)
    refit: Callable[[WorkloadConfig], PolicyFits] | None = None
    sweep_fits: dict[float, dict[str, Any]] = field(default_factory=dict)  # mean -> report
    _return_model: Any = None  # `return_model()`'s artifact, once loaded

    def settings_for(
        self, reqs: Sequence[WorkloadRequest], fits: PolicyFits | None = None
    ) -> ReplaySettings:
        scale = self.options.scale_per_s
        if scale is None:
            # A trace's scale comes from its training part, like the other fitted values.
            counted = self.first_counted
            scale = estimated_scale_per_s(reqs[:counted] if counted else reqs)
        return ReplaySettings(scale, self.fallback, (fits or self.fits).options)

    def categories(self, reqs: Sequence[WorkloadRequest]) -> list[str]:
        """Each request's workload category, which its release carries (`wa` reads it)."""
        return request_categories(reqs, self.request_types)

    def predictions(self, reqs: list[WorkloadRequest]) -> dict[str, list[float | None]]:
        turns = [r.turn for r in reqs]
        # Sources that read a request's timing (access features) take the requests.
        values = {
            name: (
                source.predict_requests(reqs)
                if hasattr(source, "predict_requests")
                else source.predict(turns)
            )
            for name, source in self.sources.items()
        }
        if "trace" in self.names:
            if self.logged is None:
                raise InvalidInputError(
                    "policy lpc-trace needs a trace whose lines carry 'probability'"
                )
            values["trace"] = self.logged
        return values

    def curves(self, reqs: list[WorkloadRequest]) -> dict[str, list[Any]]:
        """The return curves the `lpc-return` policies of either tier read, per request;
        `km-turn` is fitted on the requests before `first_counted` (a trace's training part),
        `model` read from the return-time artifact, which must not have seen the rest."""
        from lpc.replay.return_sources import check_trained_before, return_curves

        names = {
            p.curve_source for p in self.options.replayed_policies if p.curve_source is not None
        }
        model = None
        if "model" in names:
            model = self.return_model()
            check_trained_before(model, self.options.trace, self.first_counted)
        return {
            name: return_curves(name, reqs, self.first_counted, model) for name in sorted(names)
        }

    def return_model(self) -> Any:
        """The `lpc-return-model` policy's artifact, loaded once (--return-model, else the
        shipped one)."""
        if self._return_model is None:
            from lpc.replay.return_sources import load_return_model
            from training.locations import SHIPPED_RETURN_MODEL_NAME, shipped_model_dir

            path = self.options.return_model or shipped_model_dir(SHIPPED_RETURN_MODEL_NAME)
            if path is None:
                raise InvalidInputError(
                    "policy lpc-return-model needs a return-time model: --return-model DIR "
                    "(lpc train-return --out DIR)"
                )
            self._return_model = load_return_model(path, self.options.return_tail)
        return self._return_model


def _fit_sources(
    work: _Workload, context: ABContext, model_factory: ModelSourceFactory | None
) -> _Replayer:
    """Stage 3: the probability sources the policies read, built once the training part is
    known, and LPC's fallback p (the fitted continuation rate unless --fallback-p)."""
    options = work.options
    names = _sources_needed(options.replayed_policies, options.trace_probabilities)
    sources = _build_sources(names, context, model_factory)
    fallback = (
        context.base_rate if options.fallback_probability is None else options.fallback_probability
    )
    return _Replayer(
        options, sources, names, work.logged, fallback, work.first_counted, context.request_types
    )


def _fitted_evictors(options: ABOptions) -> set[str]:
    """The fitted evictors replayed in either tier."""
    return {
        p.evictor
        for p in options.replayed_policies
        if not p.cpu_tier_only and POLICIES[p.evictor].kind == "fitted"
    }


def _refuse_fitted_without_training_part(options: ABOptions) -> None:
    names = _fitted_evictors(options)
    if names:
        labels = ", ".join(p.label for p in options.replayed_policies if p.evictor in names)
        raise InvalidInputError(
            f"{labels} are fitted on the trace's training part, which --split-at 0 leaves "
            "empty; give a split (default 0.5), or leave them out"
        )


def _fit_policies(
    loaded: _Loaded, work: _Workload, context: ABContext, replayer: _Replayer
) -> None:
    """Stage 3b: the fitted policies' constants (`lpc.replay.fitted_policies`), from the
    training part only: a trace's own, or the data set's training half replayed with the same
    workload settings. Nothing to do when no fitted policy is requested."""
    names = _fitted_evictors(work.options)
    if not names:
        return
    block_size = work.options.block_size
    assert block_size is not None
    if work.trace_info:
        if not work.first_counted:
            _refuse_fitted_without_training_part(work.options)
        train = work.requests[: work.first_counted]
        cut_s = float(work.trace_info["split"]["cut_s"])
        where = (
            f"the trace's training part ({len(train)} requests, "
            f"{work.trace_info['split']['cut_after_start_s']:.0f} s)"
        )
        replayer.fits = _fit_on(names, train, cut_s, block_size, where, context.request_types)
        return

    def fit_generated(config: WorkloadConfig) -> PolicyFits:
        train = loaded.training_requests(config)
        if not train:
            raise InvalidInputError(
                f"{loaded.options.dataset}: no training-half request arrives in the window, "
                f"which {', '.join(sorted(names))} are fitted on; give a longer --duration"
            )
        end_s = max(r.arrival_s for r in train)
        where = (
            f"the {loaded.options.dataset} training half replayed with the same workload "
            f"settings ({len(train)} requests, λ_chat {config.mean_think_time_s:g} s)"
        )
        return _fit_on(names, train, end_s, block_size, where, None)

    replayer.fits = fit_generated(work.options.workload)
    replayer.refit = fit_generated


def _fit_on(
    names: set[str],
    train: Sequence[WorkloadRequest],
    end_s: float,
    block_size: int,
    where: str,
    request_types: dict[str, str] | None,
) -> PolicyFits:
    hashes = hash_turns(train, BlockHasher(block_size)) if "wa" in names else [[]] * len(train)
    categories = request_categories(train, request_types)
    return fit_policies(names, train, hashes, categories, block_size, end_s, where)


def _replay_closed_loop(
    loaded: _Loaded, work: _Workload, replayer: _Replayer, timings: dict[str, float]
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
    work: _Workload,
    replayer: _Replayer,
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
            _export_trace(work, values, files, log)
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
    summary = _summary(workload, requests, options, work.source_desc)
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
    workload: PreparedWorkload, options: ABOptions, tiers: TierSettings, settings: ReplaySettings
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


def _export_trace(
    work: _Workload,
    values: dict[str, list[float | None]],
    files: dict[str, str],
    log: Callable[[str], None],
) -> None:
    """--export-trace: the replayed requests in the project's format, with one source's
    predictions as each line's 'probability' when asked."""
    from lpc.traces.lpc_trace import write_trace

    options = work.options
    assert options.export_trace is not None
    probability = values.get(options.trace_probabilities) if options.trace_probabilities else None
    header = _trace_header(options, work.source_desc)
    # atomic: a failed write leaves no half trace (OutputWriteError naming it)
    write_trace(options.export_trace, work.requests, header, probability)
    files["trace"] = str(options.export_trace)
    log(f"trace: wrote {len(work.requests)} requests to {options.export_trace}")


def _think_time_sweep(
    loaded: _Loaded, replayer: _Replayer, timings: dict[str, float]
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
    settings: ReplaySettings,
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
    settings: ReplaySettings,
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


def _trace_header(options: ABOptions, source: str) -> dict[str, Any]:
    w = options.workload
    if options.trace is not None:
        # A re-exported trace: its timeline came from the trace and the latency model.
        return {
            "created_by": f"lpc {__version__}",
            "source": source,
            "latency": asdict(w.latency),
            "horizon_s": options.horizon_s,
            "max_model_len": options.max_model_len,
            "probability_source": options.trace_probabilities,
        }
    return {
        "created_by": f"lpc {__version__}",
        "source": source,
        "tokenizer": "qwen (ChatML)",
        "mean_think_time_s": w.mean_think_time_s,
        "max_active_conversations": w.max_active_conversations,
        "duration_s": w.duration_s,
        "seed": w.seed,
        "latency": asdict(w.latency),
        "probability_source": options.trace_probabilities,
    }


def _check_sizes(options: ABOptions, peak_in_flight: int, log: Callable[[str], None]) -> None:
    """Warn about cache sizes below twice the peak in-flight tokens: there the running
    requests alone fill the cache, and allocation failures, not eviction, set the hit ratio."""
    small = [s for s in options.cache_sizes_tokens or () if s < 2 * peak_in_flight]
    if small:
        log(
            f"warning: cache sizes {', '.join(f'{s:,}' for s in small)} are below twice the "
            f"peak in-flight tokens ({peak_in_flight:,}): requests in flight fill them"
        )


def _summary(
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


def _write_files(outcome: ABOutcome, out: Path) -> list[OutputWriteError]:
    """Every result file, each written atomically; one that cannot be written is skipped and
    its error returned, so a failure costs that file only and never leaves half of it.
    `outcome.files` lists the files written; results.json comes last and lists them all."""
    policies = [p.label for p in outcome.options.policies]
    writers: list[tuple[str, str, Callable[[Path], None]]] = [
        ("csv", "results.csv", lambda path: write_csv(path, outcome.results)),
        (
            "plot_cache_size",
            "hit_ratio_vs_cache_size.png",
            lambda path: plot_hit_vs_size(
                path, outcome.comparison, policies, "Token hit ratio vs cache size"
            ),
        ),
    ]
    if outcome.sweep:
        rows = [r for results in outcome.sweep.values() for r in results]
        title = f"Token hit ratio vs λ_chat at {outcome.options.sweep_cache_tokens // 1000}K tokens"
        writers += [
            ("sweep_csv", "think_time_sweep.csv", lambda path: write_csv(path, rows)),
            (
                "plot_think_time",
                "hit_ratio_vs_think_time.png",
                lambda path: plot_hit_vs_think_time(path, outcome.sweep, policies, title),
            ),
        ]
    if outcome.two_tier:
        writers += [
            ("two_tier_csv", "two_tier.csv", lambda p: write_two_tier_csv(p, outcome.two_tier)),
            (
                "plot_two_tier",
                "two_tier_hit_ratio.png",
                lambda p: plot_two_tier(p, outcome.two_tier),
            ),
        ]
    # A path that is not valid UTF-8 (a byte such as \xff in a file name) comes back as the
    # bytes it was, as in the terminal, instead of failing the write.
    writers.append(
        (
            "markdown",
            "report.md",
            lambda path: write_text_atomically(
                path, markdown_report(outcome), errors="surrogateescape"
            ),
        )
    )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return [OutputWriteError(out, error, "cannot create")]
    failed: list[OutputWriteError] = []
    for key, name, write in writers:
        try:
            write(out / name)
        except OutputWriteError as error:
            failed.append(error)
        else:
            outcome.files[key] = str(out / name)
    outcome.files["json"] = str(out / "results.json")
    try:
        write_json(out / "results.json", outcome.to_json())
    except OutputWriteError as error:
        del outcome.files["json"]
        failed.append(error)
    return failed


def _scale_text(used: float | None, configured: float | None) -> str:
    if used is None:
        return "n/a"
    how = "estimated from the observed think times" if configured is None else "fixed"
    return f"{used:.4g} per second ({how})"


def markdown_report(outcome: ABOutcome) -> str:
    s = outcome.workload_summary
    policies = [p.label for p in outcome.options.policies]
    if "trace" in s:
        return _markdown_trace_report(outcome)
    lines = [
        "# LPC A/B replay",
        "",
        f"Workload: {s.get('source')}"
        + (
            f", {s['requests']} requests from {s['conversations']} conversations, "
            f"{s['prompt_tokens']:,} prompt tokens; λ_chat {s['mean_think_time_s']:g} s, "
            f"N_conv {s['max_active_conversations']}, window {s['duration_s']} s, "
            f"seed {s['seed']}, "
            f"block size {s['block_size']}."
            if "requests" in s
            else " (closed loop)."
        ),
        "",
        f"LPC decay scale: {_scale_text(s.get('scale_per_s'), outcome.options.scale_per_s)}.",
        "",
    ]
    if "no_training_part" in s:
        lines += [_no_training_part_sentence(s["no_training_part"]), ""]
    if "fitted_policies" in s:
        lines += [*fitted_policies_text(s["fitted_policies"]), ""]
    for title, header, rows in comparison_tables(outcome.comparison, policies):
        lines += [f"## {title}", "", markdown_table(header, rows), ""]
    lines += ["![hit ratio vs cache size](hit_ratio_vs_cache_size.png)", ""]
    if outcome.sweep:
        header, rows = sweep_table(outcome.sweep, policies)
        lines += [
            f"## Hit ratio vs λ_chat at {outcome.options.sweep_cache_tokens // 1000}K tokens "
            "(gain over LRU)",
            "",
            markdown_table(header, rows),
            "",
            "![hit ratio vs think time](hit_ratio_vs_think_time.png)",
            "",
        ]
    lines += _two_tier_markdown(outcome)
    lines += ["## Timings", "", *(f"- {k}: {v:.1f}" for k, v in outcome.timings_s.items()), ""]
    return "\n".join(lines)


def _two_tier_markdown(outcome: ABOutcome) -> list[str]:
    if not outcome.two_tier:
        return []
    return [
        "## Two tiers (GPU prefix cache + CPU offload tier)",
        "",
        markdown_table(TABLE_HEADER, two_tier_rows(outcome.two_tier)),
        "",
        "![two tiers](two_tier_hit_ratio.png)",
        "",
        *_versus_best_markdown(outcome),
    ]


def _versus_best_markdown(outcome: ABOutcome) -> list[str]:
    if not outcome.two_tier_versus_best:
        return []
    return [
        "### LPC in both tiers against the best other pair (95 % paired interval)",
        "",
        *(f"- {line}" for line in versus_best_text(outcome.two_tier_versus_best)),
        "",
    ]


def trace_description(summary: dict[str, Any]) -> list[str]:
    """The trace's import, split and linkage in sentences (markdown report and terminal)."""
    t = summary["trace"]
    split = t["split"]
    lines = [
        f"Trace: {summary['source']} ({t['format']}), {summary['replayed_requests']} requests "
        f"over {summary['span_s']:.0f} s, replayed at block size {summary['block_size']}.",
        f"Split at {split['cut_after_start_s']:.0f} s: "
        f"{split['train_requests']} training requests warm the cache, hit ratios count the "
        f"{split['eval_requests']} evaluation requests ({summary['prompt_tokens']:,} prompt "
        "tokens).",
        f"Peak in-flight tokens: {summary['peak_in_flight_tokens']:,}.",
    ]
    if "linkage" in t:
        link = t["linkage"]
        lines.append(
            f"Prefix linkage (shared-block fan-out {link['shared_fanout']}): "
            f"{link['linked_requests']} of {link['requests']} requests "
            f"({link['linked_share']:.1%}) continue an earlier one; "
            f"{link['conversations']} conversations, {link['multi_turn_conversations']} with "
            f"several turns (at most {link['max_turns']}); {link['branched_parents']} requests "
            f"continued more than once; {link['shared_blocks']} shared blocks."
        )
    if "request_log" in t:
        engine = t["request_log"]
        lines.append(
            f"Request log: {engine['requests']} requests in {engine['files']} file(s); the "
            f"engine's token hit ratio over all of them {engine['engine_token_hit_ratio']:.2%} "
            f"({engine['cached_tokens']} of {engine['prompt_tokens']} prompt tokens cached)."
        )
    if "orphans" in t:
        lines.append(
            f"Conversations from chat ids; {t['orphans']} requests whose parent is not in the "
            f"trace start their own. Types: {t.get('types')}."
        )
    if "horizon_s" in t:
        lines.append(
            f"Oracle label: next request of the conversation within {t['horizon_s']:g} s of "
            f"completion; {t['continuing_labels']} requests continue, of which "
            f"{t['censored_labels']} are censored at the trace's end (counted as continuing)."
        )
    if t.get("cut_to_max_model_len"):
        lines.append(
            f"{t['cut_to_max_model_len']} requests cut to --max-model-len "
            f"{summary.get('max_model_len')} tokens."
        )
    if t.get("skipped_last_lines"):
        n, files = t["skipped_last_lines"], ", ".join(t.get("cut_last_line_files", []))
        lines.append(f"Skipped {n} cut last line{'s' if n > 1 else ''} in {files}.")
    if "no_training_part" in summary:
        lines.append(_no_training_part_sentence(summary["no_training_part"]))
    if "fitted_policies" in summary:
        lines += fitted_policies_text(summary["fitted_policies"])
    return lines


def fitted_policies_text(report: dict[str, Any]) -> list[str]:
    """One sentence per fitted policy: what its training part gave (details in the JSON)."""
    lines = []
    if "session-ref" in report:
        t = report["session-ref"]
        lines.append(
            f"session-ref: idle timeout {t['timeout_s']:.0f} s, the {t['quantile']:g} quantile "
            f"of {t['gaps']} think times of {t['fitted_on']}."
        )
    if "wa" in report:
        w = report["wa"]
        cats = w["categories"]
        parts = ", ".join(
            f"{c} p={f['p']:.2f}/{f['mean_reuse_s']:.0f} s" for c, f in list(cats.items())[:8]
        )
        more = f" and {len(cats) - 8} more" if len(cats) > 8 else ""
        lines.append(
            f"wa: reuse probability / mean reuse time per category, fitted on {w['fitted_on']}: "
            f"{parts}{more} (all: p={w['default']['p']:.2f}/"
            f"{w['default']['mean_reuse_s']:.0f} s)."
        )
    return lines


def _no_training_part_sentence(note: dict[str, Any]) -> str:
    text = _no_training_part_text(note)
    return f"{text[0].upper()}{text[1:]}."


def _markdown_trace_report(outcome: ABOutcome) -> str:
    s = outcome.workload_summary
    policies = [p.label for p in outcome.options.policies]
    lines = ["# LPC A/B replay of a request trace", ""]
    lines += [*(f"- {line}" for line in trace_description(s)), ""]
    lines += [
        f"LPC decay scale: {_scale_text(s.get('scale_per_s'), outcome.options.scale_per_s)}.",
        "",
    ]
    for title, header, rows in comparison_tables(outcome.comparison, policies):
        lines += [f"## {title}", "", markdown_table(header, rows), ""]
    lines += ["![hit ratio vs cache size](hit_ratio_vs_cache_size.png)", ""]
    lines += _two_tier_markdown(outcome)
    lines += ["## Timings", "", *(f"- {k}: {v:.1f}" for k, v in outcome.timings_s.items()), ""]
    return "\n".join(lines)


def summary_text(outcome: ABOutcome) -> str:
    policies = [p.label for p in outcome.options.policies]
    text = terminal_report(outcome.comparison, policies)
    summary = outcome.workload_summary
    if "trace" in summary:
        text = "\n".join(trace_description(summary)) + "\n\n" + text
    elif "fitted_policies" in summary:
        text = "\n".join(fitted_policies_text(summary["fitted_policies"])) + "\n\n" + text
    if outcome.sweep:
        header, rows = sweep_table(outcome.sweep, policies)
        text += "\n\n" + text_table(
            f"Token hit ratio vs λ_chat at {outcome.options.sweep_cache_tokens // 1000}K tokens",
            header,
            rows,
        )
    if outcome.two_tier:
        text += "\n\n" + text_table(
            "Two tiers: token hit ratio by tier, TTFT and prefill saved",
            TABLE_HEADER,
            two_tier_rows(outcome.two_tier),
        )
        if outcome.two_tier_versus_best:
            text += "\n\nLPC in both tiers against the best other pair (95 % paired interval):\n"
            text += "\n".join(versus_best_text(outcome.two_tier_versus_best))
    return text


def outcome_json(outcome: ABOutcome) -> str:
    return json.dumps(outcome.to_json(), indent=2, default=str)
