"""The return-time model inside the plugin: a `ReturnCurve` per finished release, in process.

`predictor.return_time.ReturnTimePredictor` gives the curve `lpc-return` reads from the same
access features the in-process access model reads, computed where that model's p is: in
`access_runtime.AccessRuntime`'s release. One model serves both tiers: the GPU plugin's release
carries the curve to the free queue and, by request id, to the CPU tier's
`LPCReturnCachePolicy`.

Loading, reloads and the fail-safe: docs/design.md, "The return-time runtime".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lpc.integrations.artifact_folders import (
    PROBE_REQUEST,
    LoadedArtifact,
    PromotionWatch,
    load_configured,
)
from lpc.integrations.config import PluginConfig, PluginConfigError
from lpc.integrations.conversation_table import EMPTY_CONVERSATION
from lpc.integrations.stats import PluginStats
from predictor.access_features import ConversationState, RequestState
from predictor.return_curve import ReturnCurve
from predictor.return_time import ReturnTimePredictor

logger = logging.getLogger("vllm.plugins.lpc")

RETURN_EVICTOR = "lpc-return"
# Survival may rise by this much between grid points and still count as flat
# (`ReturnCurve`'s own tolerance).
SURVIVAL_TOLERANCE = 1e-12


def curve_problem(curve: object, grid_s: np.ndarray) -> str | None:
    """Why `curve` cannot key a block (None: it can). A curve on the model's own grid (the
    object checked at load) has its survival checked here — it starts at 1, never rises, stays
    finite and >= 0 — in a Python loop over a dozen floats (about a microsecond); any other
    curve goes through `ReturnCurve`'s full validation."""
    if type(curve) is not ReturnCurve:
        return f"not a ReturnCurve but {type(curve).__name__}"
    if curve.times_s is not grid_s:
        try:
            ReturnCurve(curve.times_s, curve.survival)
        except (ValueError, TypeError) as error:
            return str(error)
        return None
    values = np.asarray(curve.survival, dtype=float).tolist()
    if len(values) != len(grid_s):
        return f"{len(values)} survival values for a grid of {len(grid_s)} points"
    if not abs(values[0] - 1.0) <= 1e-9:
        return f"survival starts at {values[0]!r}, not 1"
    previous = values[0]
    for value in values:
        if not value <= previous + SURVIVAL_TOLERANCE:  # NaN fails this too
            return f"survival rises or is not a number ({previous!r} then {value!r})"
        previous = value
    if not values[-1] >= -SURVIVAL_TOLERANCE:
        return f"survival ends below 0 ({values[-1]!r})"
    return None


def load_checked_return(folder: str | Path) -> ReturnTimePredictor:
    """`ReturnTimePredictor.load` (every check `lpc ab` and `lpc models check` make:
    `predictor.artifact_checks`), refusing too (ValueError) a model whose curve for a probe
    request is not a valid `ReturnCurve` (checked in full, its grid included): it would give
    garbage for every release."""
    predictor = ReturnTimePredictor.load(folder)
    with np.errstate(all="ignore"):  # non-finite weights are what the check below is for
        probe = predictor.curve_one(PROBE_REQUEST, EMPTY_CONVERSATION)
    try:
        ReturnCurve(probe.times_s, probe.survival)
    except ValueError as error:
        raise ValueError(
            f"artifact {folder}: its curve for a probe request is not a survival curve "
            f"({error}; weights not finite?)"
        ) from None
    return predictor


# The loaded return-time model, published to the release path with one assignment.
LoadedReturnModel = LoadedArtifact[ReturnTimePredictor]


@dataclass
class ReturnModelRuntime:
    """The loaded return-time model, its reload check and the checked curve of a release."""

    path: Path  # as configured
    model: LoadedReturnModel
    stats: PluginStats
    reload_s: float
    _check_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._watch = PromotionWatch(self.path, "return-time model", "return_model_reload_failures")

    @classmethod
    def load(cls, config: PluginConfig, stats: PluginStats) -> ReturnModelRuntime:
        """Load `config.return_model`; one `PluginConfigError` naming the setting and path."""
        assert config.return_model is not None
        model = load_configured(
            config.return_model,
            "LPC_RETURN_MODEL (return_model)",
            "a return-time model",
            load_checked_return,
        )
        return cls(Path(config.return_model), model, stats, config.return_model_reload_s)

    @property
    def needs_tokens(self) -> bool:
        return self.model.needs_tokens

    # -- the release path ---------------------------------------------------------------------
    def curve(self, request: RequestState, conversation: ConversationState) -> ReturnCurve | None:
        """The checked curve of one release; None (the fallback score) when the model raises
        or its curve is not valid, counted and the first of each logged. Never raises."""
        model = self.model  # read once: a reload publishes a new one
        try:
            curve = model.predictor.curve_one(request, conversation)
            problem = curve_problem(curve, model.predictor.grid_s)
        except Exception as error:
            self._failed(error)
            return None
        return self._checked(curve, problem)

    def curves(
        self, states: Sequence[tuple[RequestState, ConversationState]]
    ) -> list[ReturnCurve | None]:
        """`curve` of several releases (those a scheduler step finishes) in one forward pass
        (`ReturnTimePredictor.curves`), each checked and counted as `curve` checks it; when
        the pass raises, every release gets the fallback score. Never raises."""
        model = self.model  # read once: a reload publishes a new one
        predictor = model.predictor
        try:
            rows = np.array([predictor.state_row(r, c) for r, c in states], np.float32)
            made = predictor.curves(rows)
            problems = [curve_problem(curve, predictor.grid_s) for curve in made]
        except Exception as error:
            for _ in states:
                self._failed(error)
            return [None] * len(states)
        return [self._checked(c, p) for c, p in zip(made, problems, strict=True)]

    def _failed(self, error: Exception) -> None:
        self.stats.fault(
            "return_curve_errors",
            "the return-time model cannot give a curve for a release (%r); fallback score",
            error,
        )

    def _checked(self, curve: ReturnCurve, problem: str | None) -> ReturnCurve | None:
        """The curve, counted, or None (the fallback score) when `problem` says it is not a
        survival curve (counted, the first logged)."""
        if problem is not None:
            self.stats.fault(
                "invalid_return_curves",
                "the return-time model gave a curve that is not a survival curve (%s); "
                "fallback score",
                problem,
            )
            return None
        self.stats.add(return_curves_in_process=1)
        return curve

    # -- off the scheduler thread -------------------------------------------------------------
    def check_for_promoted_model(self) -> None:
        """One reload check, now: swap in a newly promoted model if one has appeared. Never
        raises: anything wrong with the folder keeps the old model and is counted once per
        state of the folder (`return_model_reload_failures`)."""
        with self._check_lock:
            self._check()

    def _check(self) -> None:
        promoted = self._watch.poll(self.model.pointer, load_checked_return, self.stats)
        if promoted is None:
            return
        pointer, predictor = promoted
        self.model = LoadedReturnModel.of(predictor, pointer)
        self.stats.add(return_model_reloads=1)
        logger.info("return-time model reloaded from %s", pointer[0])

    def counters(self) -> dict[str, Any]:
        return {"return_model_path": self.model.pointer[0]}


def load_return_runtime(config: PluginConfig, stats: PluginStats) -> ReturnModelRuntime | None:
    """The in-process return-time model `config` names, or None when none is named. The
    `lpc-return` evictor without one is refused (it would key every block at its fallback
    score: a slower LRU)."""
    if config.return_model is None:
        if config.evictor == RETURN_EVICTOR:
            raise PluginConfigError(
                f"LPC_EVICTOR (evictor) = {RETURN_EVICTOR!r} needs a return-time model: set "
                "LPC_RETURN_MODEL (return_model) to an artifact folder of `lpc train-return` "
                "or to a registry folder (the daily job's <registry>-return)"
            )
        return None
    return ReturnModelRuntime.load(config, stats)
