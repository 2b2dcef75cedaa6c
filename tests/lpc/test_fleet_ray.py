"""Fleet cells on a local Ray give the serial run's figures digit for digit.

Ray starts once per test process (the files that use it run in one worker), locally with two
CPUs. Where it is not installed or cannot start, the test is skipped with the reason (pytest -ra
lists it), never passed silently. Starting Ray takes seconds, so this file runs in the slow
step (CI step 1b); the default suite's check of the cells themselves, serially:
tests/lpc/test_fleet.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lpc.fleet.fanout import Executor, run_cells
from lpc.fleet.pipeline import prepare_workload
from lpc.fleet.replay import FleetCell
from lpc.replay.ab_options import ABOptions
from lpc.replay.policies import parse_policies
from tests.conftest import RAY_WORKERS as WORKERS
from tests.lpc.traces.helpers import bundled_lines

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fleet-ray")
    trace = folder / "small.jsonl"
    trace.write_text("\n".join(bundled_lines()[:160]) + "\n")
    options = ABOptions(
        trace=trace,
        policies=tuple(parse_policies("lru,lpc-turns,lpc-return-km")),
        progress=False,
        out_dir=folder / "out",
    )
    return prepare_workload(options, None, lambda _: None)


def test_ray_cells_equal_the_serial_cells(local_ray, prepared) -> None:
    cells = [
        FleetCell(router, spec, instances, 2_000_000)
        for router in ("round-robin", "prefix-aware")
        for spec in parse_policies("lru,lpc-turns,lpc-return-km")
        for instances in (1, 2)
    ]
    serial = run_cells(prepared.workload, prepared.settings, cells)
    done: list[str] = []
    on_ray = run_cells(
        prepared.workload,
        prepared.settings,
        cells,
        Executor("ray", workers=WORKERS),
        lambda r: done.append(r.policy),
    )
    assert len(done) == len(cells)
    for a, b in zip(serial, on_ray, strict=True):
        assert dataclasses.replace(a, seconds=0.0, cpu_seconds=0.0) == dataclasses.replace(
            b, seconds=0.0, cpu_seconds=0.0
        )
        assert a.per_request is not None and b.per_request is not None
        assert np.array_equal(a.per_request.hit_tokens, b.per_request.hit_tokens)
