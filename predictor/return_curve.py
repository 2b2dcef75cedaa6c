"""When a conversation comes back: a survival curve, and the question an evictor asks of it.

A `ReturnCurve` is the survival function S(t) = P(no next request by t after the release) on
increasing grid points, S(0) = 1; the learned return-time model and the baselines all answer
through it. An evictor asks P(return within W | silent for a) = (S(a) − S(a + W)) / S(a).
Pure numpy, microseconds.

Why this question, the interpolation and the tail: docs/design.md, "Return curves".
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def log_spaced_edges(first_s: float = 5.0, last_s: float = 3600.0, count: int = 16) -> np.ndarray:
    """Grid points 0, first_s, ..., last_s, log-spaced after 0 (the default: 5 s to 1 h)."""
    if not 0 < first_s < last_s or count < 2:
        raise ValueError(f"need 0 < first_s < last_s and count >= 2, got {first_s}, {last_s}")
    return np.concatenate([[0.0], np.geomspace(first_s, last_s, count)])


@dataclass(frozen=True, eq=False)
class ReturnCurve:
    """S(t) at `times_s` (increasing, starting at 0, where S = 1; non-increasing).

    Compared by identity: its arrays have no truth value, and the releases that carry a curve
    are compared with each other (vLLM's CPU tier groups equal releases into one push).
    `survival_at` reads Python-float copies of both arrays (the same doubles, so the same
    results bit for bit), made once: an evictor re-keying its queue asks every queued claim's
    curve, and `bisect` on a list costs a fraction of `np.searchsorted` on a dozen points."""

    times_s: np.ndarray
    survival: np.ndarray
    tail_exponent: float = 0.0

    def __post_init__(self) -> None:
        t, s = np.asarray(self.times_s, float), np.asarray(self.survival, float)
        if t.ndim != 1 or t.shape != s.shape or len(t) < 2:
            raise ValueError("times_s and survival must be 1-d, of one length >= 2")
        # `diff > 0` is False for NaN (`diff <= 0` would be too, letting a NaN through)
        if t[0] != 0.0 or not np.all(np.diff(t) > 0) or not np.all(np.isfinite(t)):
            raise ValueError("times_s must be finite, start at 0 and increase")
        if not np.all(np.isfinite(s)) or abs(s[0] - 1.0) > 1e-9 or np.any(np.diff(s) > 1e-12):
            raise ValueError("survival must start at 1 and never increase")
        if s[-1] < -1e-12:
            raise ValueError("survival must stay >= 0")
        if not (math.isfinite(self.tail_exponent) and self.tail_exponent >= 0.0):
            raise ValueError(f"tail_exponent must be finite and >= 0, got {self.tail_exponent!r}")
        self._keep_lists()

    def _keep_lists(self) -> None:
        object.__setattr__(self, "_times", np.asarray(self.times_s, dtype=float).tolist())
        object.__setattr__(self, "_survival", np.asarray(self.survival, dtype=float).tolist())

    @classmethod
    def of_valid(
        cls, times_s: np.ndarray, survival: np.ndarray, tail_exponent: float = 0.0
    ) -> ReturnCurve:
        """A curve whose producer guarantees what `__post_init__` checks (e.g. S built as
        exp(−cumulative hazard) on a fixed grid): no checks, for the per-release path, where
        they cost more than the prediction."""
        curve = object.__new__(cls)
        object.__setattr__(curve, "times_s", times_s)
        object.__setattr__(curve, "survival", survival)
        object.__setattr__(curve, "tail_exponent", tail_exponent)
        curve._keep_lists()
        return curve

    def survival_at(self, t_s: float) -> float:
        """S(t), interpolated linearly in log time between grid points."""
        times, survival = self._times, self._survival
        if t_s <= 0.0:
            return 1.0
        if t_s >= times[-1]:
            if self.tail_exponent == 0.0 or t_s == times[-1]:
                return float(survival[-1])
            return float(survival[-1] * (t_s / times[-1]) ** -self.tail_exponent)
        k = bisect_right(times, t_s)  # times[k-1] <= t < times[k]
        t0, t1 = times[k - 1], times[k]
        s0, s1 = survival[k - 1], survival[k]
        # The first interval is linear in t (log 0 is undefined), the others in log t.
        w = t_s / t1 if t0 <= 0.0 else math.log(t_s / t0) / math.log(t1 / t0)
        return float(s0 + w * (s1 - s0))

    def p_return_within(self, silent_s: float, window_s: float) -> float:
        """P(next request within `window_s` | none for `silent_s`); 0 once S is 0."""
        now = self.survival_at(silent_s)
        if now <= 0.0:
            return 0.0
        later = self.survival_at(silent_s + window_s)
        return min(1.0, max(0.0, (now - later) / now))

    @property
    def never_share(self) -> float:
        """An upper bound on P(never returns): what S keeps at the last grid point."""
        return float(self.survival[-1])


def continued_hazard_exponent(times_s: Sequence[float], survival: Sequence[float]) -> float:
    """The tail exponent β that continues the last grid interval's hazard per log-second:
    ln(S(t_{K−1}) / S(t_K)) / ln(t_K / t_{K−1}), so that S(t) = S(t_K)·(t/t_K)^(−β) beyond t_K
    has the slope in log S per log t of the last interval. 0 when the last interval starts at
    0 (no log slope) or S(t_K) is 0 (nothing left to return)."""
    table = np.asarray(survival, np.float64)[None, :]
    return float(continued_hazard_exponents(np.asarray(times_s, np.float64), table)[0])


def continued_hazard_exponents(times_s: np.ndarray, survival: np.ndarray) -> np.ndarray:
    """`continued_hazard_exponent` of every row of an (n, K + 1) survival table at once."""
    t0, t1 = float(times_s[-2]), float(times_s[-1])
    s = np.asarray(survival, np.float64)
    if t0 <= 0.0:
        return np.zeros(len(s))
    with np.errstate(divide="ignore", invalid="ignore"):
        beta = np.log(s[:, -2] / s[:, -1]) / math.log(t1 / t0)
    return np.where((s[:, -1] > 0.0) & (s[:, -2] > s[:, -1]), beta, 0.0)
