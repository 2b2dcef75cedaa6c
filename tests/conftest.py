"""Shared pytest configuration: tests import the checkout they run in.

The serving-engine tests' summary ("LPC inside real serving engines": what was compared, what
it cost) is gathered here, in the process that prints the terminal summary, from the reports
of the tests that wrote it (`user_properties` named `ENGINE_REPORT`, attached by
tests/integrations/conftest.py): with pytest-xdist the tests run in worker processes, and
this root conftest is the one every process loads.
"""

from __future__ import annotations

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
