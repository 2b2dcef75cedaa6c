"""Atomicity under SIGKILL: a real `run_retrain` process killed at chosen steps never leaves
the registry pointing at anything that does not load, and the next run recovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from predictor.artifact import load_artifact
from tests.training.test_training_retrain import add_log, config, retrain
from training.model_registry import ModelRegistry
from training.retrain import LOCKED, PROMOTED

REPO = Path(__file__).resolve().parents[2]
DRIVER = """
import sys
from pathlib import Path
from tests.training.pause_points import install
from tests.training.test_training_retrain import config, retrain
install(sys.argv[2], Path(sys.argv[3]))
print(retrain(config(Path(sys.argv[1]), force=True)).status, flush=True)
"""


def run_until(point: str, tmp_path: Path, timeout_s: float = 600.0) -> None:
    """Start a retrain in a subprocess, wait until it pauses at `point`, SIGKILL it."""
    marker = tmp_path / "paused"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path), point, str(marker)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not marker.exists():
            if process.poll() is not None:
                output = process.stdout.read().decode(errors="replace")
                raise AssertionError(f"the job ended before {point}: {output[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the job did not reach {point} in {timeout_s} s")
            time.sleep(0.1)
        assert marker.read_text().split() == [point, str(process.pid)]
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
        process.stdout.close()
    assert process.returncode == -signal.SIGKILL


POINTS = [
    pytest.param("registry-staged", id="artifact-written-not-published"),
    pytest.param("registry-published", id="version-published-current-not-switched"),
    pytest.param("retrain-trained", id="trained-nothing-written", marks=pytest.mark.slow),
]


@pytest.mark.slow  # a training process per kill point (about 11 s): CI step 1b
@pytest.mark.parametrize("point", POINTS)
def test_killed_job_leaves_the_current_model_loadable(tmp_path, point):
    add_log(tmp_path, 1, count=120)
    assert retrain(config(tmp_path)).status == PROMOTED
    registry = ModelRegistry(tmp_path / "registry")
    before = load_artifact(registry.current_link).metadata.weights_sha256

    add_log(tmp_path, 2, count=120)
    run_until(point, tmp_path)

    assert registry.current_version() == "v0001"
    assert load_artifact(registry.current_link).metadata.weights_sha256 == before
    for version in registry.versions():  # whatever is visible is whole
        load_artifact(registry.root / version)
    expected = ["v0001", "v0002"] if point == "registry-published" else ["v0001"]
    assert registry.versions() == expected
    leftovers = [p.name for p in registry.root.iterdir() if p.name.startswith(".incoming")]
    assert bool(leftovers) == (point == "registry-staged")

    # the kernel released the dead job's lock; the next run cleans up and goes on
    recovered = retrain(config(tmp_path, force=True))
    assert recovered.status != LOCKED and recovered.status == PROMOTED
    assert not [
        p for p in registry.root.iterdir() if p.name.startswith((".incoming", "..incoming"))
    ]
    load_artifact(registry.current_link)
