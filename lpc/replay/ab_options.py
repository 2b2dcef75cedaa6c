"""What `lpc ab` is asked to do: the options, what the probability sources are built from,
and which sources and fitted policies the options call for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eviction import POLICIES
from lpc.errors import InvalidInputError
from lpc.replay.policies import DEFAULT_POLICIES, PolicySpec, parse_policies
from lpc.replay.probability import ProbabilitySource
from lpc.replay.two_tier import TierSettings
from lpc.traces.linkage import DEFAULT_SHARED_FANOUT
from lpc.traces.timeline import DEFAULT_HORIZON_S
from lpc.workload import WorkloadConfig
from training.conversation import Conversation

DATASET_MAX_MODEL_LEN = 32768
# Production traces come from long-context models (Kimi serves 128K); a longer prompt is cut.
TRACE_MAX_MODEL_LEN = 131072

# source name -> builds a source once the training half is known
ModelSourceFactory = Callable[["SourceInputs"], ProbabilitySource]


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
class SourceInputs:
    """What the probability sources are built from, learned before replaying: the training
    part's turn counts and continuation rate, the evaluation conversations a model looks up,
    and a trace's request types."""

    train_turn_counts: list[int]
    base_rate: float
    eval_conversations: list[Conversation] = field(default_factory=list)  # for model sources
    request_types: dict[str, str] | None = None  # trace request id -> Bailian type


def sources_needed(policies: Sequence[PolicySpec], extra: str | None) -> set[str]:
    names = {p.source for p in policies if p.source not in (None, "const")}
    if extra:
        names.add(extra)
    return names  # type: ignore[return-value]


def is_fitted(spec: PolicySpec) -> bool:
    """lpc-turns, and the policies whose constants are fitted (`wa`, `session-ref`)."""
    return spec.source == "turns" or POLICIES[spec.evictor].kind == "fitted"


def fitted_evictors(options: ABOptions) -> set[str]:
    """The fitted evictors replayed in either tier."""
    return {
        p.evictor
        for p in options.replayed_policies
        if not p.cpu_tier_only and POLICIES[p.evictor].kind == "fitted"
    }


def refuse_fitted_without_training_part(options: ABOptions) -> None:
    names = fitted_evictors(options)
    if names:
        labels = ", ".join(p.label for p in options.replayed_policies if p.evictor in names)
        raise InvalidInputError(
            f"{labels} are fitted on the trace's training part, which --split-at 0 leaves "
            "empty; give a split (default 0.5), or leave them out"
        )
