"""`lpc ab`'s probability sources and fitted policies, built from the training part only, and
the `Replayer` that hands each replay its predictions, curves and settings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lpc.blocks.hashing import BlockHasher
from lpc.errors import InvalidInputError
from lpc.replay.ab import ReplayConstants
from lpc.replay.ab_options import (
    ABOptions,
    ModelSourceFactory,
    SourceInputs,
    fitted_evictors,
    refuse_fitted_without_training_part,
    sources_needed,
)
from lpc.replay.ab_plan import LoadedInputs, ReplayWorkload
from lpc.replay.fitted_policies import PolicyFits, fit_policies, request_categories
from lpc.replay.probability import OracleSource, ProbabilitySource, TurnsSource
from lpc.replay.simulator import hash_turns
from lpc.workload import WorkloadConfig, WorkloadRequest, estimated_scale_per_s


def build_sources(
    names: set[str], context: SourceInputs, model_factory: ModelSourceFactory | None
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


@dataclass
class Replayer:
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
    ) -> ReplayConstants:
        scale = self.options.scale_per_s
        if scale is None:
            # A trace's scale comes from its training part, like the other fitted values.
            counted = self.first_counted
            scale = estimated_scale_per_s(reqs[:counted] if counted else reqs)
        return ReplayConstants(scale, self.fallback, (fits or self.fits).options)

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


def fit_sources(
    work: ReplayWorkload, context: SourceInputs, model_factory: ModelSourceFactory | None
) -> Replayer:
    """Stage 3: the probability sources the policies read, built once the training part is
    known, and LPC's fallback p (the fitted continuation rate unless --fallback-p)."""
    options = work.options
    names = sources_needed(options.replayed_policies, options.trace_probabilities)
    sources = build_sources(names, context, model_factory)
    fallback = (
        context.base_rate if options.fallback_probability is None else options.fallback_probability
    )
    return Replayer(
        options, sources, names, work.logged, fallback, work.first_counted, context.request_types
    )


def fit_policy_constants(
    loaded: LoadedInputs, work: ReplayWorkload, context: SourceInputs, replayer: Replayer
) -> None:
    """Stage 3b: the fitted policies' constants (`lpc.replay.fitted_policies`), from the
    training part only: a trace's own, or the data set's training half replayed with the same
    workload settings. Nothing to do when no fitted policy is requested."""
    names = fitted_evictors(work.options)
    if not names:
        return
    block_size = work.options.block_size
    assert block_size is not None
    if work.trace_info:
        if not work.first_counted:
            refuse_fitted_without_training_part(work.options)
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
