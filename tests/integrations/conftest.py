"""Fixtures for the serving-engine tests, and a summary of what they compared.

The tests against real engines run their engine's python in a subprocess (each engine has
its own venv). They are skipped, loudly, only when that python does not exist; an engine
that exists but fails is a test failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lpc.drivers.vllm_driver import vllm_python_path
from tests.conftest import ENGINE_REPORT
from tests.integrations.report import REPORT
from tests.integrations.snippets import sglang_python_path


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    path = vllm_python_path()
    if not path.exists():
        pytest.skip(
            f"!!! LPC vLLM PLUGIN TESTS SKIPPED: no vLLM python at {path}. Run "
            "`bash scripts/setup_vllm_plugin.sh` or set LPC_VLLM_PYTHON. !!!"
        )
    return path


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    path = sglang_python_path()
    if not path.exists():
        pytest.skip(
            f"!!! LPC SGLANG TESTS SKIPPED: no SGLang python at {path}. Run "
            "`bash scripts/setup_sglang_venv.sh` or set LPC_SGLANG_PYTHON. !!!"
        )
    return path


@pytest.fixture(autouse=True)
def _report_lines_travel_with_the_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Attach the REPORT lines a test wrote to its report: under pytest-xdist (the default
    suite runs in workers) a worker's REPORT never reaches the process that prints the
    summary, but a test's `user_properties` travel with its report (tests/conftest.py
    prints them)."""
    start = len(REPORT)
    yield
    request.node.user_properties.extend((ENGINE_REPORT, line) for line in REPORT[start:])
