"""Named pause points for the SIGKILL tests, installed from outside the product code.

A test starts the daily job in a subprocess that first calls `install(point, marker)`: it
wraps the product function that marks the point, so the process writes `marker` (the test
then knows where the job is) and sleeps until it is killed. The product code carries no hook.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _pause(point: str, marker: Path) -> None:
    marker.write_text(f"{point} {os.getpid()}\n", encoding="utf-8")
    while True:  # until killed
        time.sleep(3600)


def _before(function: Callable[..., Any], point: str, marker: Path) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _pause(point, marker)
        return function(*args, **kwargs)

    return wrapped


def _after(function: Callable[..., Any], point: str, marker: Path) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        _pause(point, marker)
        return result

    return wrapped


def install(point: str, marker: Path) -> None:
    """Pause the job at `point`:

    - `registry-staged`: the new version written and synced in its staging folder, not yet
      renamed to a version name (`publish_folder` asks for a free name only then);
    - `registry-published`: the version renamed into place, `current` not switched yet;
    - `retrain-trained`: the candidate trained, nothing written.
    """
    import training.model_registry as registry
    import training.retrain as retrain

    if point == "registry-staged":
        registry.ModelRegistry.next_version = _before(
            registry.ModelRegistry.next_version, point, marker
        )
    elif point == "registry-published":
        registry.ModelRegistry.publish_folder = _after(
            registry.ModelRegistry.publish_folder, point, marker
        )
    elif point == "retrain-trained":
        retrain.train_predictor = _after(retrain.train_predictor, point, marker)
    else:
        raise ValueError(f"unknown pause point {point!r}")
