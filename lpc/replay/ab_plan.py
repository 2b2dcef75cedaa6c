"""`lpc ab`'s plan: load the chat data set or the trace, split off the training part, fit the
turns source and the fallback on it, and build the requests every policy replays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from eviction.lpc import DEFAULT_FALLBACK_PROBABILITY
from lpc.errors import InvalidInputError
from lpc.replay.ab import DEFAULT_CACHE_SIZES_TOKENS, TRACE_CACHE_SIZES_TOKENS
from lpc.replay.ab_options import (
    ABOptions,
    SourceInputs,
    is_fitted,
    refuse_fitted_without_training_part,
    sources_needed,
)
from lpc.replay.probability import TurnsSource
from lpc.traces.timeline import DEFAULT_SPLIT_AT
from lpc.workload import ScriptedTurn, WorkloadConfig, WorkloadRequest, open_loop_requests

if TYPE_CHECKING:
    from lpc.chat.conversation_workload import SplitDataset
    from lpc.chat.tokenizers import ChatTokenizer
    from lpc.traces.load import LoadedTrace
    from lpc.traces.timeline import TimeSplit


@dataclass
class LoadedInputs:
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


def load_inputs(options: ABOptions, log: Callable[[str], None]) -> LoadedInputs:
    """Stage 1: the chat data set, loaded only when something reads it (a generated workload;
    on a trace, a fit the trace cannot make). A trace the requested predictor cannot read
    fails first, before minutes of loading."""
    from lpc.chat.conversation_workload import load_split
    from lpc.chat.tokenizers import default_chat_tokenizer

    if options.trace is not None:
        _check_trace_readable(options)
        if options.split_at == 0:
            refuse_fitted_without_training_part(options)
    tokenizer = default_chat_tokenizer()
    needed = sources_needed(options.replayed_policies, options.trace_probabilities)
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
    loaded = LoadedInputs(options, dataset, tokenizer, trace_has_training_part)
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
    log(f"data: {no_training_part_text(note)}")
    return options, note


def _without_unfittable_defaults(options: ABOptions) -> tuple[ABOptions, list[str]]:
    """Default policies that need a training part (lpc-turns) left out, with their labels;
    a list the user gave is kept as it is (and refused if it needs the fit)."""
    if not options.policies_by_default:
        return options, []
    kept = tuple(p for p in options.policies if not is_fitted(p))
    left_out = [p.label for p in options.policies if is_fitted(p)]
    return replace(options, policies=kept), left_out


def _needs_fit(options: ABOptions) -> str:
    """What a training part must fit: lpc-turns, wa, session-ref (and --trace-probabilities
    turns); "" when nothing requested needs it."""
    fitted = [p.label for p in options.policies if is_fitted(p)]
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
    needed = sources_needed(options.replayed_policies, options.trace_probabilities)
    gaps = needed & {"model", "trace"}
    if options.fallback_probability is None and gaps:
        note["fallback_probability"] = DEFAULT_FALLBACK_PROBABILITY
    return note


def no_training_part_text(note: dict[str, Any]) -> str:
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
        and "model" in sources_needed(options.replayed_policies, options.trace_probabilities)
    ):
        raise InvalidInputError(
            f"the learned predictor reads user prompts; a {fmt} trace has no text "
            "(use lpc-turns, or an lpc trace in chat form)"
        )


def dataset_context(dataset: SplitDataset | None) -> SourceInputs:
    """What the data set's training half fits: turn counts and the continuation rate (LPC's
    default fallback p). A trace with a training part refits both on it later."""
    train_counts = [c.num_user_turns for c in dataset.train if c.num_user_turns] if dataset else []
    base_rate = (
        TurnsSource.fit(train_counts).base_rate if train_counts else DEFAULT_FALLBACK_PROBABILITY
    )
    return SourceInputs(train_counts, base_rate, dataset.eval if dataset else [])


@dataclass
class ReplayWorkload:
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


def build_workload(
    loaded: LoadedInputs, context: SourceInputs, log: Callable[[str], None]
) -> ReplayWorkload:
    """Stage 2: the requests to replay, from the trace or generated from the evaluation half
    (a closed loop generates its own per policy, later). A trace also refits `context`."""
    options = loaded.options
    if options.trace is not None:
        work = _trace_workload(loaded, context, log)
    else:
        closed_loop = options.workload.latency.closed_loop
        requests = [] if closed_loop else loaded.generated_requests(options.workload)
        work = ReplayWorkload(options, requests, f"{options.dataset} evaluation half")
    work.options = replace(
        work.options,
        block_size=work.options.block_size or 16,
        cache_sizes_tokens=work.options.cache_sizes_tokens or DEFAULT_CACHE_SIZES_TOKENS,
    )
    work.no_training_part = work.no_training_part or loaded.no_training_part
    return work


def _trace_workload(
    loaded: LoadedInputs, context: SourceInputs, log: Callable[[str], None]
) -> ReplayWorkload:
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
        split, kept = replay_until(requests, split, options.replay_until_s)
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
        log(f"trace: {no_training_part_text(note)}")
    return ReplayWorkload(
        options,
        requests,
        f"{trace.format} trace {trace.path}",
        split.first_eval,
        logged,
        trace_info,
        trace.trace_block_size,
        note,
    )


def replay_until(
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
    trace: LoadedTrace, split: TimeSplit, options: ABOptions, context: SourceInputs
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
