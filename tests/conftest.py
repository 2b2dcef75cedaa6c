"""Shared pytest configuration: tests import the checkout they run in.

The serving-engine tests' summary ("LPC inside real serving engines": what was compared, what
it cost) is gathered here, in the process that prints the terminal summary, from the reports
of the tests that wrote it (`user_properties` named `ENGINE_REPORT`, attached by
tests/integrations/conftest.py): with pytest-xdist the tests run in worker processes, and
this root conftest is the one every process loads.

Each pytest-xdist worker runs its OpenMP libraries (scikit-learn's histogram gradient
boosting, torch) on one thread: two workers on two cores, each with an OpenMP team as wide as
the machine, made the access-model training tests 20x slower than alone (OpenMP threads
waiting at barriers for a team member descheduled by the other worker) and the default suite
509 s instead of 196 s. Set before anything here imports numpy, scikit-learn or torch; a
value already in the environment is kept.
"""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

ENGINE_REPORT = "lpc_engine_report"
_SUMMARY: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _SUMMARY.extend(value for name, value in report.user_properties if name == ENGINE_REPORT)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _SUMMARY:
        return
    terminalreporter.section("LPC inside real serving engines")
    for line in _SUMMARY:
        terminalreporter.write_line(line)


RAY_WORKERS = 2  # the local Ray's processors (`local_ray`)


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray for the tests that fan out on it, or a loud skip when it cannot start."""
    try:
        import ray
    except ModuleNotFoundError:
        pytest.skip("RAY NOT TESTED: Ray is not installed (pip install 'lpc[ray]')")
    try:
        ray.init(num_cpus=RAY_WORKERS, include_dashboard=False, log_to_driver=False)
    except Exception as error:  # any failure to start is a reason to skip, stated
        pytest.skip(f"RAY NOT TESTED: a local Ray could not start: {error}")
    yield ray
    ray.shutdown()
