"""Prequential evaluation on a trace: train before t, replay [t, t + Δ), roll t.

Every window is a deployment of its own: the access classifier and the return-time model are
trained on the requests arriving before t (the shipped recipes and validation rules, nothing
re-tuned), the cache is warmed by replaying everything before t, and hit ratios count the
requests arriving in [t, t + Δ) only (`ABOptions.replay_until_s`). Model quality is scored on
the same window's releases (`lpc.access.window_quality`). Trained models are kept under the
output folder (`models/t<seconds>/access`, `…/return`) and reused when present, so a rerun
replays without retraining. The protocol and the grid: docs/results.md ("Prequential
windows").
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lpc.access.return_training import ReturnTrainOptions
from lpc.access.training import TraceTrainOptions
from lpc.errors import InvalidInputError
from lpc.replay.ab import TRACE_CACHE_SIZES_TOKENS
from lpc.replay.policies import PolicySpec, parse_policies
from predictor.atomic_files import OutputWriteError, ResultsNotSavedError, write_text_atomically

DEFAULT_STARTS_S = (1200.0, 1800.0, 2400.0, 3000.0)
DEFAULT_WIDTH_S = 600.0
DEFAULT_POLICIES = (
    "lru",
    "lpc-pooled",
    "lpc-return-km",
    "lpc-return-model",
    "lhd",
    "wa",
    "belady",
)
MODEL_FILE = "metadata.json"  # written last by both artifact writers: a folder holding it is whole


@dataclass(frozen=True)
class Window:
    """[start_s, end_s), seconds after the trace's first arrival; the models of this window
    train on the requests arriving before `start_s`."""

    start_s: float
    end_s: float

    @property
    def name(self) -> str:
        return f"t{self.start_s:g}"

    def label(self) -> str:
        return f"{self.start_s / 60:g}–{self.end_s / 60:g} min"


def window_grid(starts_s: Sequence[float], width_s: float) -> list[Window]:
    """The windows [t, t + width) for each t; starts must be ascending, at least 1 s (a
    `--split-at` below 1 would read as a fraction) and the windows must not overlap."""
    if not starts_s:
        raise InvalidInputError("give at least one window start")
    if not width_s > 0:
        raise InvalidInputError(f"the window width must be > 0 seconds, got {width_s:g}")
    if any(t < 1 for t in starts_s):
        raise InvalidInputError(f"window starts are seconds >= 1, got {list(starts_s)}")
    if any(b < a + width_s for a, b in itertools.pairwise(starts_s)):
        raise InvalidInputError(
            f"window starts must ascend by at least the width ({width_s:g} s), got {list(starts_s)}"
        )
    return [Window(float(t), float(t) + width_s) for t in starts_s]


@dataclass(frozen=True)
class PrequentialOptions:
    trace: str | Path = "mooncake"
    windows: tuple[Window, ...] = field(
        default_factory=lambda: tuple(window_grid(DEFAULT_STARTS_S, DEFAULT_WIDTH_S))
    )
    policies: tuple[PolicySpec, ...] = field(
        default_factory=lambda: tuple(parse_policies(",".join(DEFAULT_POLICIES)))
    )
    cache_sizes_tokens: tuple[int, ...] = TRACE_CACHE_SIZES_TOKENS
    out_dir: Path = Path("results/prequential")
    workers: int = 2
    progress: bool = True


@dataclass
class WindowOutcome:
    window: Window
    training: dict[str, Any]  # the two models: where, rows, choices
    quality: dict[str, Any]  # classifier and hazard model on the window's releases
    replay: dict[str, Any]  # `lpc ab --json`'s workload, results and comparison
    timings_s: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "window": {"start_s": self.window.start_s, "end_s": self.window.end_s},
            "training": self.training,
            "quality": self.quality,
            "replay": self.replay,
            "timings_s": self.timings_s,
        }


def _has_model(folder: Path) -> bool:
    return (folder / MODEL_FILE).is_file()


def window_training_options(
    trace: str | Path, window: Window
) -> tuple[TraceTrainOptions, ReturnTrainOptions]:
    """The two trainers' options for a window: the shipped recipes, every default kept, the
    training part ending at the window's start (`--split-at` in seconds)."""
    return (
        TraceTrainOptions(trace=trace, split_at=window.start_s),
        ReturnTrainOptions(trace=trace, split_at=window.start_s, classifier=None, intervals=0),
    )


def train_window_models(
    trace: str | Path, window: Window, folder: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """The window's access classifier and return-time model, trained on the requests before
    `window.start_s` with the shipped recipes (reused when already in `folder`)."""
    from lpc.access.return_training import train_return_on_trace
    from lpc.access.training import train_on_trace

    access, hazard = folder / "access", folder / "return"
    access_options, return_options = window_training_options(trace, window)
    info: dict[str, Any] = {"access": str(access), "return": str(hazard)}
    if _has_model(access):
        log(f"{window.name}: reusing {access}")
    else:
        report = train_on_trace(access_options, access)
        info["access_report"] = {
            k: report[k]
            for k in ("split", "samples", "validation", "member_epochs", "served", "timings_s")
        }
    if _has_model(hazard):
        log(f"{window.name}: reusing {hazard}")
    else:
        outcome = train_return_on_trace(return_options, hazard)
        r = outcome.report
        info["return_report"] = {
            k: r[k]
            for k in (
                "split",
                "samples",
                "grid_s",
                "hidden_sizes",
                "epochs",
                "members",
                "timings_s",
            )
        }
    return info


def window_quality(trace: str | Path, window: Window, folder: Path) -> dict[str, Any]:
    """Both models of `folder` scored on the window's releases."""
    from lpc.access.window_quality import classifier_quality, hazard_quality
    from lpc.replay.ab_options import TRACE_MAX_MODEL_LEN
    from lpc.replay.request_table import request_table
    from lpc.traces.load import TraceOptions, load_trace
    from predictor.access_predictor import AccessPredictor
    from predictor.return_time import ReturnTimePredictor
    from training.access_defaults import DEFAULT_ACCESS_HORIZON_S

    loaded = load_trace(trace, TraceOptions(max_model_len=TRACE_MAX_MODEL_LEN))
    table = request_table(loaded.requests, loaded.request_types)
    first = float(table["arrival_s"].iloc[0])
    start, end = first + window.start_s, first + window.end_s
    classifier = AccessPredictor.load(folder / "access")
    horizon = classifier.horizon_s or DEFAULT_ACCESS_HORIZON_S
    hazard = ReturnTimePredictor.load(folder / "return")
    return {
        "classifier": classifier_quality(table, classifier, start, end, horizon),
        "return_model": hazard_quality(table, hazard, start, end),
    }


def replay_window(
    options: PrequentialOptions,
    window: Window,
    folder: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """`lpc ab`'s trace replay split at the window's start and stopped at its end, with the
    window's own models (`folder`/access for the access policies, `folder`/return for
    `lpc-return-model`), both trained before the window."""
    from lpc.access.source import access_source_factory
    from lpc.replay.ab_options import ABOptions
    from lpc.replay.ab_run import run_ab

    ab_options = ABOptions(
        trace=Path(options.trace),
        split_at=window.start_s,
        replay_until_s=window.end_s,
        policies=options.policies,
        cache_sizes_tokens=options.cache_sizes_tokens,
        model_reads_text=False,
        out_dir=options.out_dir / "windows" / window.name,
        workers=options.workers,
        progress=options.progress,
        return_model=folder / "return",
    )
    factory = access_source_factory(folder / "access", log=log)
    outcome = run_ab(ab_options, model_factory=factory, log=log)
    full = outcome.to_json()
    return {k: full[k] for k in ("workload", "results", "comparison", "timings_s", "files")}


def run_window(
    options: PrequentialOptions, window: Window, log: Callable[[str], None]
) -> WindowOutcome:
    timings: dict[str, float] = {}
    folder = options.out_dir / "models" / window.name
    t0 = time.perf_counter()
    training = train_window_models(options.trace, window, folder, log)
    timings["train_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    quality = window_quality(options.trace, window, folder)
    timings["quality_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    replay = replay_window(options, window, folder, log)
    timings["replay_s"] = time.perf_counter() - t0
    check_window_bookkeeping(window, training, replay)
    return WindowOutcome(window, training, quality, replay, timings)


def check_window_bookkeeping(
    window: Window, training: dict[str, Any], replay: dict[str, Any]
) -> None:
    """The replay's cut is the window's start, its end the window's end, and each freshly
    trained model's training part ended at the window's start: a window whose training data
    reached t would score a model on requests it had seen."""
    split = replay["workload"]["trace"]["split"]
    if abs(split["cut_after_start_s"] - window.start_s) > 1e-6:
        raise AssertionError(f"{window.name}: replay split at {split['cut_after_start_s']} s")
    if split.get("replay_until_s") != window.end_s:
        raise AssertionError(f"{window.name}: replay stopped at {split.get('replay_until_s')}")
    for key in ("access_report", "return_report"):
        if key in training:
            cut = training[key]["split"]["cut_after_start_s"]
            if abs(cut - window.start_s) > 1e-6:
                raise AssertionError(f"{window.name}: {key} trained before {cut} s")


def run_prequential(
    options: PrequentialOptions, log: Callable[[str], None] = print
) -> list[WindowOutcome]:
    """Every window in turn; each window's JSON is written as soon as it is done
    (`windows/<name>/prequential.json`), the whole list at the end (`prequential.json`).

    Each file is written atomically. One that cannot be written (a full disk) does not stop
    the run: the windows go on, and at the end `ResultsNotSavedError` carries every outcome
    and names the files that failed, so the caller can still print the figures."""
    from tqdm import tqdm

    outcomes = []
    failed: list[OutputWriteError] = []
    written: list[Path] = []

    def save(path: Path, payload: Any) -> None:
        try:
            write_text_atomically(path, json.dumps(payload, indent=2))
        except OutputWriteError as error:
            log(f"{error}; the run goes on")
            failed.append(error)
        else:
            written.append(path)

    bar = tqdm(options.windows, desc="windows", unit="window", disable=not options.progress)
    for window in bar:
        outcome = run_window(options, window, log)
        save(options.out_dir / "windows" / window.name / "prequential.json", outcome.to_json())
        outcomes.append(outcome)
    save(options.out_dir / "prequential.json", [o.to_json() for o in outcomes])
    if failed:
        raise ResultsNotSavedError(outcomes, failed, written)
    return outcomes
