"""Fixtures for the serving-engine tests, and a summary of what they compared.

The tests against real engines run their engine's python in a subprocess (each engine has
its own venv). They are skipped, loudly, only when that python does not exist; an engine
that exists but fails is a test failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lpc.drivers.vllm_driver import vllm_python_path
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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not REPORT:
        return
    terminalreporter.section("LPC inside real serving engines")
    for line in REPORT:
        terminalreporter.write_line(line)
