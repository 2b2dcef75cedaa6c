"""Where a duration falls on a return-time grid: the interval, the log-time share inside it.

Shared by the hazard likelihood (`training.return_fit`) and the gradient-boosted teacher's
person-period rows (`training.return_distil`), so both weigh a censored share of an interval
exactly as the served curve's interpolation does (linear in t in the first interval, in log
t after it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class IntervalIndex:
    """Where each duration falls on a grid: interval k (1-based), the log-time weight w
    inside it, and whether it lies beyond the last point."""

    interval: np.ndarray
    weight: np.ndarray
    beyond: np.ndarray


def interval_index(grid_s: np.ndarray, time_s: np.ndarray) -> IntervalIndex:
    grid_s = np.asarray(grid_s, float)
    t = np.asarray(time_s, float)
    last = len(grid_s) - 1
    beyond = t > grid_s[-1]
    k = np.clip(np.searchsorted(grid_s, t, side="left"), 1, last)  # t_{k-1} < t <= t_k
    t0, t1 = grid_s[k - 1], grid_s[k]
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(
            k == 1, t / t1, np.log(np.maximum(t, 1e-300) / np.maximum(t0, 1e-300)) / np.log(t1 / t0)
        )
    w = np.clip(np.where(beyond, 1.0, w), 0.0, 1.0)
    return IntervalIndex(np.where(beyond, last, k), w, beyond)
