"""`lpc train-return`: the return-time model on a request trace, with its two baselines.

Loads the trace as `lpc train --trace` does (same import, linkage, latency model, time split
and request table, hence the same rows and features), builds censored return times per part,
fits the hazard model (`training.return_fit`), the Kaplan–Meier-per-turn baseline, and reads
the shipped 180-s classifier; scores all three on the evaluation part
(`training.return_quality`) and writes the artifact.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lpc.errors import InvalidInputError
from lpc.replay.ab_options import TRACE_MAX_MODEL_LEN
from lpc.replay.request_table import request_table
from lpc.traces.linkage import DEFAULT_SHARED_FANOUT
from lpc.traces.timeline import DEFAULT_SPLIT_AT
from predictor.access_features import check_names, default_feature_names, feature_frame
from predictor.atomic_files import OutputWriteError
from predictor.return_time import ReturnTimePredictor, save_return_model
from training.access_data import DEFAULT_ACCESS_HORIZON_S, DEFAULT_VALIDATION_FRACTION
from training.locations import SHIPPED_ACCESS_MODEL_NAME, shipped_model_dir
from training.paired_bootstrap import N_RESAMPLES
from training.quality_intervals import CurveSource, HorizonSource, Source, quality_intervals
from training.return_data import return_samples
from training.return_fit import (
    ReturnFitConfig,
    fit_return_model,
    fit_turn_kaplan_meier,
    km_grid,
)
from training.return_quality import curve_quality, horizon_quality
from training.survival_metrics import censoring_survival

# `ReturnTrainOptions.classifier`'s default: the 180-s classifier shipped with the code,
# found beside the package (`shipped_model_dir`), wherever the command runs from.
SHIPPED_CLASSIFIER = "shipped"


def classifier_path(classifier: Path | str | None) -> Path | None:
    """The classifier baseline's folder: None for none, the shipped one for
    `SHIPPED_CLASSIFIER` (refused in one line when this install has none), else the path."""
    if classifier is None:
        return None
    if classifier == SHIPPED_CLASSIFIER:
        shipped = shipped_model_dir(SHIPPED_ACCESS_MODEL_NAME)
        if shipped is None:
            raise InvalidInputError(
                f"the shipped classifier models/{SHIPPED_ACCESS_MODEL_NAME} is not beside this "
                "installation: pass --classifier DIR or --no-classifier"
            )
        return shipped
    return Path(classifier)


@dataclass(frozen=True)
class ReturnTrainOptions:
    trace: str | Path = "mooncake"
    trace_format: str | None = None
    split_at: float = DEFAULT_SPLIT_AT
    shared_fanout: int = DEFAULT_SHARED_FANOUT
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION
    features: tuple[str, ...] | None = None
    # the 180-s classifier scored as a baseline: a folder, `SHIPPED_CLASSIFIER`, or None
    classifier: Path | str | None = SHIPPED_CLASSIFIER
    fit: ReturnFitConfig = field(default_factory=ReturnFitConfig)
    # bootstrap resamples (over the evaluation part's conversations) of the quality figures'
    # 95 % intervals; 0: none
    intervals: int = N_RESAMPLES


@dataclass
class ReturnTrainOutcome:
    report: dict[str, Any]  # what `--json` prints
    predictor: ReturnTimePredictor  # the served model, in numpy
    evaluation_features: np.ndarray  # raw features of the evaluation part's releases


def train_return_on_trace(options: ReturnTrainOptions, out: Path | None) -> ReturnTrainOutcome:
    """Train, score and (with `out`) save."""
    from lpc.traces.load import TraceOptions, load_trace
    from lpc.traces.timeline import split_in_time

    started = time.perf_counter()
    classifier_folder = classifier_path(options.classifier)  # refused before the trace loads
    trace = load_trace(
        options.trace,
        TraceOptions(
            options.trace_format,
            horizon_s=DEFAULT_ACCESS_HORIZON_S,
            max_model_len=TRACE_MAX_MODEL_LEN,
            shared_fanout=options.shared_fanout,
        ),
    )
    split = split_in_time(trace.requests, options.split_at)
    table = request_table(trace.requests, trace.request_types)
    names = check_names(
        options.features or default_feature_names(list(table.columns)),
        "--access-features",
        "table",
        "state",
    )
    samples = return_samples(table, names, split.cut_s, options.validation_fraction)
    loaded_s = time.perf_counter() - started

    result = fit_return_model(samples, options.fit)
    metadata = result.metadata(
        names,
        metrics={},
        notes={"trace": str(options.trace), "split": split.to_dict()},
    )
    predictor = ReturnTimePredictor(metadata, result.weights, result.biases)
    training, evaluation = samples.parts["training"], samples.parts["evaluation"]
    censoring = censoring_survival(training.targets.time_s, training.targets.observed)
    turn_km = fit_turn_kaplan_meier(training, km_grid(result.grid_s))

    t, e = evaluation.targets.time_s, evaluation.targets.observed
    curves = {
        "model": CurveSource(result.grid_s, predictor.survival(evaluation.features)),
        "km_per_turn": CurveSource(turn_km.grid_s, turn_km.survival(evaluation.turn_index)),
    }
    quality: dict[str, Any] = {
        name: curve_quality(t, e, c.grid_s, c.survival, censoring) for name, c in curves.items()
    }
    sources: dict[str, Source] = dict(curves)
    classifier_info = None
    if classifier_folder is not None:
        from predictor.access_predictor import AccessPredictor

        classifier = AccessPredictor.load(classifier_folder)
        rows = evaluation.rows
        features = feature_frame(table, classifier.feature_names).to_numpy()[rows]
        horizon = classifier.horizon_s or DEFAULT_ACCESS_HORIZON_S
        p_within = classifier.predict(features)
        sources["classifier"] = HorizonSource(horizon, p_within)
        quality["classifier"] = horizon_quality(t, e, p_within, horizon, censoring)
        classifier_info = {"path": str(classifier_folder), "horizon_s": horizon}
    intervals = None
    if options.intervals > 0:
        intervals = quality_intervals(
            t,
            e,
            table["conversation_id"].to_numpy()[evaluation.rows],
            sources,
            censoring,
            n_resamples=options.intervals,
            differences=(("model", "km_per_turn"), ("model", "classifier")),
        )
    report: dict[str, Any] = {
        "trace": str(options.trace),
        "format": trace.format,
        "requests": len(trace.requests),
        "split": split.to_dict(),
        "features": list(names),
        "known_at": predictor.known_at,
        "samples": {p: samples.parts[p].counts() for p in samples.parts},
        "validation_slice": samples.validation_slice,
        "grid_s": [round(float(t), 3) for t in result.grid_s],
        "hidden_sizes": list(result.hidden),
        "epochs": result.epochs,
        "candidates": result.candidates,
        "ensemble": result.ensemble,
        "distillation": result.distillation,
        "recipe": result.recipe,
        "members": result.members,
        "km_per_turn": {
            "pooled_from_turn": turn_km.pooled_from,
            "rows_by_turn": list(turn_km.rows_by_turn),
        },
        "classifier": classifier_info,
        "quality": quality,
        "quality_ci95": intervals,
    }
    if out is not None:
        fingerprint = hashlib.sha256(
            f"{trace.path.name}:{len(trace.requests)}:{split.cut_s}".encode()
        ).hexdigest()[:16]
        metadata = result.metadata(
            names,
            metrics={"evaluation": quality, "candidates": result.candidates},
            notes={
                "trace": str(options.trace),
                "split": split.to_dict(),
                "validation_fraction": options.validation_fraction,
                "training_data_fingerprint": fingerprint,
                "epochs": result.epochs,
                "recipe": result.recipe,
            },
        )
        try:
            save_return_model(out, metadata, result.weights, result.biases)
            report["out"] = str(out)
        except OutputWriteError as error:  # the figures stay: the caller prints them
            report["write_error"] = str(error)
    report["timings_s"] = {
        "load_s": round(loaded_s, 3),
        "fit_s": round(result.fit_seconds, 3),
        "total_s": round(time.perf_counter() - started, 3),
    }
    return ReturnTrainOutcome(report, predictor, evaluation.features)
