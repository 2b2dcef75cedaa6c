"""Fixtures for the differential tests against real vLLM, and their coverage summary.

vLLM lives in its own venv (scripts/setup_vllm_venv.sh); its python is `LPC_VLLM_PYTHON`, or
`.vllm-venv/bin/python` in the repository. The tests are skipped, loudly, only when that python
does not exist: a driver that exists but fails is a test failure. One driver process replays
every stream of a module, because importing vLLM costs ~10 s of CPU.

With pytest-xdist (CI step 2 runs two workers, one file each) the tests fill each worker's
`REPORT`; a worker hands its report back when it finishes (`workeroutput`) and the controller,
which prints the terminal summary, adds them up, so the coverage lines and the "TOTAL over"
line are the same as in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from lpc.difftest.ops import Stream
from tests.vllm.vllm_support import REPORT, DriverFailed, VllmRun, run_vllm_replay, vllm_python_path


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    path = vllm_python_path()
    if not path.exists():
        pytest.skip(
            f"!!! vLLM DIFFERENTIAL TESTS SKIPPED: no vLLM python at {path}. Run "
            "`bash scripts/setup_vllm_venv.sh` or set LPC_VLLM_PYTHON to the python of a venv "
            "with vllm==0.33.0. !!!"
        )
    return path


@pytest.fixture(scope="session")
def run_vllm(
    vllm_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[Sequence[Stream]], VllmRun]:
    """Replay streams on real vLLM; a failing driver fails the test that needed it."""

    def run(streams: Sequence[Stream]) -> VllmRun:
        try:
            return run_vllm_replay(vllm_python, streams, tmp_path_factory.mktemp("vllm-replay"))
        except DriverFailed as exc:
            pytest.fail(str(exc))

    return run


_WORKER_OUTPUT = "lpc_vllm_coverage"


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: hand the report to the controller
        workeroutput[_WORKER_OUTPUT] = REPORT.as_dict()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: a worker finished; add up its report."""
    report = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT)
    if report is not None:
        REPORT.merge(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not REPORT.lines:
        return
    terminalreporter.section("vLLM differential coverage")
    for line in REPORT.lines:
        terminalreporter.write_line(line)
    if REPORT.seeds:
        terminalreporter.write_line(
            f"TOTAL over {REPORT.seeds} seeds x {REPORT.steps} steps, identical to vLLM at "
            f"every step: {REPORT.totals.summary()}"
        )
