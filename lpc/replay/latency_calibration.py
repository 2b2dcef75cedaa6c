"""Turn prefill and copy timings measured on a GPU into the latency model's figures.

`scripts/measure_tier_latency.py` times a model's prefill at several prompt lengths and the
host→device copy of a hit's KV; this module fits what `lpc.replay.latency.TierLatency` needs
from them, T(L) = c + a·L + b·L², so that the fit can be tested without a GPU.

The fit: docs/design.md, "The latency model's figures".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from sklearn.linear_model import LinearRegression

from lpc.errors import InvalidInputError


@dataclass(frozen=True)
class PrefillFit:
    """T(L) = intercept_s + s_per_token·L + s_per_token_pair·L², fitted on measured prefills."""

    intercept_s: float
    s_per_token: float
    s_per_token_pair: float
    max_relative_error: float
    lengths: tuple[int, ...]

    def seconds(self, tokens: float) -> float:
        """Modelled time of a prefill of `tokens` tokens with nothing cached."""
        return self.intercept_s + self.s_per_token * tokens + self.s_per_token_pair * tokens**2

    def suffix_seconds(self, cached_tokens: float, new_tokens: float) -> float:
        """Modelled time of prefilling `new_tokens` after `cached_tokens` already cached."""
        total = cached_tokens + new_tokens
        return self.s_per_token * new_tokens + self.s_per_token_pair * (total**2 - cached_tokens**2)

    def tokens_per_s(self, tokens: float) -> float:
        """Mean prefill speed of a prompt of `tokens` tokens (intercept included)."""
        return tokens / self.seconds(tokens)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def fit_prefill(lengths: Sequence[int], seconds: Sequence[float]) -> PrefillFit:
    """Fit T(L) = c + a·L + b·L² (a, b, c ≥ 0) to measured prefill times, in relative error."""
    x = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise InvalidInputError(
            f"prefill fit: one time per length, got {x.shape} lengths and {y.shape} times"
        )
    if len(np.unique(x)) < 3:
        raise InvalidInputError(
            f"prefill fit: needs at least 3 distinct lengths, got {sorted(set(x.tolist()))}"
        )
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or (x <= 0).any() or (y <= 0).any():
        raise InvalidInputError("prefill fit: lengths and times must be finite and > 0")
    features = np.column_stack([x, x**2])
    model = LinearRegression(positive=True)
    model.fit(features, y, sample_weight=1.0 / y**2)
    a, b = (float(v) for v in model.coef_)
    c = max(float(model.intercept_), 0.0)
    predicted = c + a * x + b * x**2
    error = float(np.max(np.abs(predicted - y) / y))
    return PrefillFit(
        intercept_s=c,
        s_per_token=a,
        s_per_token_pair=b,
        max_relative_error=error,
        lengths=tuple(int(v) for v in x),
    )


def copy_bandwidth(num_bytes: int, seconds: Sequence[float]) -> float:
    """Bytes per second of a copy of `num_bytes` bytes, from its best (shortest) timing."""
    best = min(seconds, default=math.nan)
    if not math.isfinite(best) or best <= 0 or num_bytes <= 0:
        raise InvalidInputError(
            f"copy bandwidth: needs a positive size and times, got {num_bytes} B, {list(seconds)}"
        )
    return num_bytes / best
