"""The checks every model artifact passes before anything predicts with it, in one place.

Each of the four places that load an artifact (the replay, the vLLM plugin, the prediction
server, `lpc models check`) calls the checks below for the fields its kind has, so an artifact
one refuses, all refuse, with the same one line naming the file and the field. The checks
import nothing of the project's, so every loader can import them.

What they catch that a sha256 cannot: docs/design.md, "Artifact checks".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def number_problem(value: Any) -> str | None:
    """Why `value` is not a finite number (None: it is). bool is refused: JSON `true` is no
    mean or standard deviation."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"is not a number ({value!r})"
    if not math.isfinite(value):
        return f"is not finite ({value!r})"
    return None


def check_standardisation(name: Any, mean: Any, std: Any) -> None:
    """ValueError naming the input and field unless `mean` is finite and `std` finite and
    > 0 (the loaders divide by it)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"input name must be a non-empty string, got {name!r}")
    for field, value in (("mean", mean), ("std", std)):
        problem = number_problem(value)
        if problem is not None:
            raise ValueError(f"input {name!r}: {field} {problem}")
    if std <= 0:
        raise ValueError(f"input {name!r}: std must be > 0, got {std!r}")


def check_grid(grid_s: Sequence[Any]) -> None:
    """ValueError unless `grid_s` is at least two finite numbers, starting at 0, strictly
    increasing: the points a return curve's survival is given at."""
    values = list(grid_s)
    if len(values) < 2:
        raise ValueError(f"grid_s needs at least 2 points, got {len(values)}")
    for index, value in enumerate(values):
        problem = number_problem(value)
        if problem is not None:
            raise ValueError(f"grid_s[{index}] {problem}")
    if values[0] != 0:
        raise ValueError(f"grid_s must start at 0, got {values[0]!r}")
    for index in range(1, len(values)):
        if not values[index] > values[index - 1]:
            raise ValueError(
                f"grid_s must increase: grid_s[{index}] = {values[index]!r} after "
                f"{values[index - 1]!r}"
            )


def check_choice(field: str, value: Any, supported: Sequence[str]) -> None:
    """ValueError unless `value` is one of the `supported` values of `field`."""
    if value not in supported:
        raise ValueError(
            f"{field} {value!r} is not supported (this code implements "
            f"{', '.join(map(repr, supported))})"
        )


def check_layer_sizes(field: str, sizes: Sequence[Any]) -> None:
    """ValueError unless every entry of `sizes` is a positive integer."""
    for index, size in enumerate(sizes):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{field}[{index}] must be a positive integer, got {size!r}")


def non_finite_tensor(tensors: dict[str, Any]) -> str | None:
    """The name of the first tensor (numpy array or torch tensor) holding NaN or infinity,
    in name order; None when all are finite."""
    for name in sorted(tensors):
        if not np.isfinite(np.asarray(tensors[name], dtype=np.float64)).all():
            return name
    return None
