"""What the `fitted` policies learn from a replay's training part, and the categories WA reads.

`wa` needs, per request category (request type × turn), the chance that a released block is
used again and the rate of its reuse time; `session-ref` needs its idle timeout; `tlru` and
`sglang-tlru` take theirs from `lpc.replay.tlru_fit`. Every rule is written down before any
evaluation request is replayed.

The categories and the fitting rules: docs/design.md, "Fitting rules".
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eviction.session_ref import DEFAULT_TIMEOUT_S
from eviction.wa import DEFAULT_REUSE_PROBABILITY, DEFAULT_REUSE_RATE_PER_S
from lpc.blocks.hashing import BlockHash
from lpc.replay.tlru_fit import fit_tlru
from lpc.workload import WorkloadRequest, observed_think_times

MAX_TURN = 8  # turns 8, 9, ... share the category `<type>_8+`
DEFAULT_TYPE = "chat"
MIN_RELEASES = 200
MIN_REUSES = 20
TIMEOUT_QUANTILE = 0.9
EM_ITERATIONS = 500
EM_TOLERANCE = 1e-10

FITTED_POLICIES = ("wa", "session-ref", "tlru", "sglang-tlru")


def category_of(request_type: str, turn_index: int) -> str:
    """`<type>_<turn>` with the 1-based turn, `<type>_8+` from turn 8 on."""
    turn = turn_index + 1
    return f"{request_type}_{turn}" if turn < MAX_TURN else f"{request_type}_{MAX_TURN}+"


def type_of(category: str) -> str:
    return category.rsplit("_", 1)[0]


def request_categories(
    requests: Sequence[WorkloadRequest], request_types: Mapping[str, str] | None = None
) -> list[str]:
    """Each request's category; types from the trace when it records them, else `chat`."""
    types = request_types or {}
    return [category_of(types.get(r.request_id, DEFAULT_TYPE), r.turn.turn_index) for r in requests]


@dataclass(frozen=True)
class ReuseFit:
    """One category's (or a pooled) reuse model."""

    probability: float
    rate_per_s: float
    releases: int
    reuses: int  # observed within the training part
    source: str  # "own", "type <t>" or "all": whose releases it was fitted on

    def to_dict(self) -> dict[str, Any]:
        return {
            "p": self.probability,
            "rate_per_s": self.rate_per_s,
            "mean_reuse_s": 1.0 / self.rate_per_s,
            "releases": self.releases,
            "reuses": self.reuses,
            "fitted_on": self.source,
        }


def fit_cure_exponential(
    reuse_s: np.ndarray, censored_exposure_s: np.ndarray
) -> tuple[float, float]:
    """Maximum likelihood (p, λ) of "reused with probability p after an Exp(λ) time, else
    never", from observed reuse times and the exposures of releases never seen reused.

    EM: a censored release is a future reuser with weight w = p·e^(−λe) / (1 − p + p·e^(−λe));
    then p = (n_reused + Σw) / n and λ = n_reused / (Σ reuse times + Σ w·e).
    """
    n_obs, n = len(reuse_s), len(reuse_s) + len(censored_exposure_s)
    if n_obs == 0:
        return 0.0, DEFAULT_REUSE_RATE_PER_S
    total_reuse = float(np.sum(reuse_s))
    if total_reuse <= 0.0:
        total_reuse = 1e-9 * n_obs  # every reuse at the same instant as its release
    p = n_obs / n
    rate = n_obs / total_reuse
    exposure = np.asarray(censored_exposure_s, dtype=float)
    for _ in range(EM_ITERATIONS):
        stay = p * np.exp(-rate * exposure)
        weights = stay / (1.0 - p + stay) if p < 1.0 else np.ones_like(exposure)
        p_next = (n_obs + float(np.sum(weights))) / n
        rate_next = n_obs / (total_reuse + float(np.sum(weights * exposure)))
        done = abs(p_next - p) < EM_TOLERANCE and abs(rate_next - rate) < EM_TOLERANCE * rate
        p, rate = p_next, rate_next
        if done:
            break
    return min(max(p, 0.0), 1.0), rate


@dataclass
class WAFit:
    categories: dict[str, ReuseFit]
    default: ReuseFit
    fitted_on: str

    def evictor_options(self) -> dict[str, Any]:
        return {
            "categories": {c: (f.probability, f.rate_per_s) for c, f in self.categories.items()},
            "default": (self.default.probability, self.default.rate_per_s),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "fitted_on": self.fitted_on,
            "rule": "per category (request type x turn): P(a released block is used again) "
            "and its exponential reuse rate, maximum likelihood with censoring at the end of "
            f"the training part; categories with < {MIN_RELEASES} releases or < {MIN_REUSES} "
            "reuses use their type's pooled fit, else the overall one (the default)",
            "window": "running mean age of evicted blocks (online, per replay)",
            "default": self.default.to_dict(),
            "categories": {c: f.to_dict() for c, f in sorted(self.categories.items())},
        }


def fit_wa(
    requests: Sequence[WorkloadRequest],
    block_hashes: Sequence[Sequence[BlockHash]],
    categories: Sequence[str],
    block_size: int,
    end_s: float,
    fitted_on: str,
) -> WAFit:
    """WA's per-category reuse models from `requests` (a training part) alone."""
    uses: dict[BlockHash, list[float]] = defaultdict(list)
    for request, hashes in zip(requests, block_hashes, strict=True):
        for h in hashes[: (request.turn.num_prompt_tokens - 1) // block_size]:
            uses[h].append(request.arrival_s)
    for times in uses.values():
        times.sort()
    observed: dict[str, list[float]] = defaultdict(list)
    censored: dict[str, list[float]] = defaultdict(list)
    for request, hashes, category in zip(requests, block_hashes, categories, strict=True):
        done = request.completion_s
        num_full = min(len(request.turn.token_ids) // block_size, len(hashes))
        for h in hashes[:num_full]:
            times = uses.get(h, ())
            i = bisect.bisect_right(times, done)
            if i < len(times):
                observed[category].append(times[i] - done)
            else:
                censored[category].append(max(end_s - done, 0.0))

    def fit(names: Sequence[str], source: str) -> ReuseFit:
        reuse = np.array([x for c in names for x in observed[c]], dtype=float)
        exposure = np.array([x for c in names for x in censored[c]], dtype=float)
        if len(reuse) == 0:
            return ReuseFit(
                DEFAULT_REUSE_PROBABILITY if len(exposure) == 0 else 0.0,
                DEFAULT_REUSE_RATE_PER_S,
                len(exposure),
                0,
                source,
            )
        p, rate = fit_cure_exponential(reuse, exposure)
        return ReuseFit(p, rate, len(reuse) + len(exposure), len(reuse), source)

    def enough(names: Sequence[str]) -> bool:
        reuses = sum(len(observed[c]) for c in names)
        return reuses >= MIN_REUSES and reuses + sum(len(censored[c]) for c in names) >= (
            MIN_RELEASES
        )

    names = sorted(set(categories))
    overall = fit(names, "all")
    by_type: dict[str, list[str]] = defaultdict(list)
    for c in names:
        by_type[type_of(c)].append(c)
    pooled = {t: fit(cs, f"type {t}") for t, cs in by_type.items() if enough(cs)}
    fits = {}
    for c in names:
        if enough([c]):
            fits[c] = fit([c], "own")
        else:
            fits[c] = pooled.get(type_of(c), overall)
    return WAFit(fits, overall, fitted_on)


@dataclass(frozen=True)
class TimeoutFit:
    timeout_s: float
    gaps: int
    fitted_on: str

    def evictor_options(self) -> dict[str, Any]:
        return {"timeout_s": self.timeout_s}

    def to_dict(self) -> dict[str, Any]:
        return {
            "timeout_s": self.timeout_s,
            "quantile": TIMEOUT_QUANTILE,
            "gaps": self.gaps,
            "fitted_on": self.fitted_on,
            "rule": f"the {TIMEOUT_QUANTILE:g} quantile of the training part's think times "
            "(completion to the same conversation's next arrival)"
            + ("" if self.gaps else f"; no gap seen, so the default {DEFAULT_TIMEOUT_S:g} s"),
        }


def fit_session_timeout(requests: Sequence[WorkloadRequest], fitted_on: str) -> TimeoutFit:
    gaps = [g for g in observed_think_times(requests) if g >= 0.0]
    if not gaps:
        return TimeoutFit(DEFAULT_TIMEOUT_S, 0, fitted_on)
    return TimeoutFit(float(np.quantile(gaps, TIMEOUT_QUANTILE)), len(gaps), fitted_on)


@dataclass
class PolicyFits:
    """Evictor options per fitted policy (what `make_evictor` receives) and the report."""

    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)


def fit_policies(
    names: set[str],
    requests: Sequence[WorkloadRequest],
    block_hashes: Sequence[Sequence[BlockHash]],
    categories: Sequence[str],
    block_size: int,
    end_s: float,
    fitted_on: str,
) -> PolicyFits:
    """Fit each requested policy in `names` (evictor names) on one training part."""
    if not math.isfinite(end_s):
        raise ValueError(f"the training part's end must be finite, got {end_s!r}")
    fits = PolicyFits()
    if "wa" in names:
        wa = fit_wa(requests, block_hashes, categories, block_size, end_s, fitted_on)
        fits.options["wa"] = wa.evictor_options()
        fits.report["wa"] = wa.to_dict()
    if "session-ref" in names:
        timeout = fit_session_timeout(requests, fitted_on)
        fits.options["session-ref"] = timeout.evictor_options()
        fits.report["session-ref"] = timeout.to_dict()
    for name in sorted(names & {"tlru", "sglang-tlru"}):  # one rule (lpc.replay.tlru_fit)
        tlru = fit_tlru(requests, block_size, fitted_on)
        fits.options[name] = tlru.evictor_options()
        fits.report[name] = tlru.to_dict()
    return fits
