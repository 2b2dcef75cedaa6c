"""Fixtures shared by the `lpc` tests (none applies by itself: a test asks for it by name)."""

from __future__ import annotations

import pytest

from tests.lpc.plots import skip_plots


@pytest.fixture
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """`lpc ab` writes every report but draws no plot: for tests that read the figures, JSON,
    CSV or markdown and never a PNG. Drawing them with matplotlib takes most of a small run's
    time; the PNGs themselves are checked by tests that draw them
    (tests/lpc/test_ab_cli.py::test_generated_run_writes_every_report for the cache-size and
    think-time plots, tests/lpc/test_ab_two_tier_cli.py for the two-tier plot)."""
    skip_plots(monkeypatch)
