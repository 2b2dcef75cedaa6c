"""Placeholders for `lpc ab`'s plots, for tests that never read a PNG (`no_plots` in
tests/lpc/conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from predictor.atomic_files import atomic_path

# What is written in place of a PNG: not an image, so no test can mistake it for one.
PLOT_PLACEHOLDER = b"plot not drawn in this test\n"
# `lpc ab`'s plot writers, as `lpc.replay.ab_report.write_files` calls them
LINE_PLOTS = ("plot_hit_vs_size", "plot_hit_vs_think_time")
ALL_PLOTS = (*LINE_PLOTS, "plot_two_tier")


def placeholder_plot(path: Path, *_: Any, **__: Any) -> None:
    """Where a plot would be drawn: a placeholder, written as atomically as the PNG (so a
    failed write still fails the same way)."""
    with atomic_path(path) as temporary:
        Path(temporary).write_bytes(PLOT_PLACEHOLDER)


def skip_plots(monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...] = ALL_PLOTS) -> None:
    """`lpc ab` writes placeholders instead of drawing the plots `names`, until the test ends."""
    import lpc.replay.ab_report as ab_report

    for name in names:
        monkeypatch.setattr(ab_report, name, placeholder_plot)


@contextlib.contextmanager
def plots_skipped(names: tuple[str, ...] = ALL_PLOTS) -> Iterator[None]:
    """`skip_plots` for a block (a module-scoped fixture's runs)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        skip_plots(monkeypatch, names)
        yield
