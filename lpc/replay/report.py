"""Reports of an A/B run: terminal tables, CSV, a markdown page and PNG plots.

All figures come from `ReplayResult`s and their `Comparison`; nothing here computes a hit.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lpc.replay.ab import Comparison
from lpc.replay.simulator import ReplayResult
from predictor.atomic_files import atomic_open, atomic_path, write_text_atomically


def _k(size: int) -> str:
    if size >= 1_000_000:
        return f"{size / 1e6:g}M"
    return f"{size / 1000:g}K"


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value * 100:+.1f}%" if signed else f"{value * 100:.1f}%"


def _interval(bounds: Sequence[float] | None) -> str:
    if bounds is None:
        return "–"
    low, high = bounds
    return f"[{100 * low:+.1f}, {100 * high:+.1f}] %"


def text_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    line = "  ".join(
        h.ljust(w) if i == 0 else h.rjust(w)
        for i, (h, w) in enumerate(zip(header, widths, strict=True))
    )
    out = [title, line, "-" * len(line)]
    for row in rows:
        out.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return "\n".join(out)


def comparison_tables(
    comparison: Comparison, policies: Sequence[str]
) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of each table, shared by the terminal and markdown reports."""
    sizes = comparison.sizes
    header = ["policy", *(_k(s) for s in sizes)]
    tables = [
        (
            "Token hit ratio by cache size (tokens)",
            header,
            [[p, *(_pct(comparison.hit_ratio[p].get(s)) for s in sizes)] for p in policies],
        )
    ]
    others = [p for p in policies if p != "lru"]
    if comparison.gain_over_lru:
        tables.append(
            (
                "Relative gain over LRU",
                header,
                [
                    [p, *(_pct(comparison.gain_over_lru[p].get(s), True) for s in sizes)]
                    for p in others
                ],
            )
        )
    if any(v is not None for row in comparison.gain_over_lru_ci95.values() for v in row.values()):
        tables.append(
            (
                "Relative gain over LRU, 95 % interval (paired bootstrap over conversations)",
                header,
                [
                    [p, *(_interval(comparison.gain_over_lru_ci95[p].get(s)) for s in sizes)]
                    for p in others
                    if p in comparison.gain_over_lru_ci95
                ],
            )
        )
    if comparison.gap_closed:
        tables.append(
            (
                "Share of the LRU→oracle gap closed",
                header,
                [
                    [p, *(_pct(comparison.gap_closed[p].get(s)) for s in sizes)]
                    for p in others
                    if p != "oracle"
                ],
            )
        )
    if comparison.gap_closed_belady:
        tables.append(
            (
                "Share of the LRU→Belady gap closed",
                header,
                [
                    [p, *(_pct(comparison.gap_closed_belady[p].get(s)) for s in sizes)]
                    for p in others
                    if p != "belady"
                ],
            )
        )
    if comparison.size_for_lru_ratio:
        rows = []
        for p in others:
            cells = []
            for s in sizes:
                needed = comparison.size_for_lru_ratio[p].get(s)
                cells.append(
                    "never"
                    if needed is None
                    else f"{_k(round(needed, -3))} ({_pct(1 - needed / s, True)})"
                )
            rows.append([p, *cells])
        tables.append(
            ("Cache each policy needs for LRU's hit ratio (saving vs LRU's size)", header, rows)
        )
    return tables


def terminal_report(comparison: Comparison, policies: Sequence[str]) -> str:
    return "\n\n".join(text_table(t, h, r) for t, h, r in comparison_tables(comparison, policies))


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(
    path: Path, results: Sequence[ReplayResult], extra: Mapping[str, Any] | None = None
) -> None:
    rows = [{**(extra or {}), **r.to_dict()} for r in results]
    with atomic_open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _line_plot(
    path: Path,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    xlabel: str,
    title: str,
) -> None:
    """One line per policy, upper bounds dashed, hit ratios in percent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, (xs, ys) in series.items():
        style = "--" if policy in ("oracle", "belady") else "-"
        ax.plot(xs, [y * 100 for y in ys], style, marker="o", label=policy)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("token hit ratio (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def save_figure(fig: Any, path: Path) -> None:
    """Save a matplotlib figure atomically (no truncated PNG on a full disk), then free it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_path(path) as temporary:
            fig.savefig(temporary, dpi=120)
    finally:
        plt.close(fig)


def plot_hit_vs_size(
    path: Path, comparison: Comparison, policies: Sequence[str], title: str
) -> None:
    series = {}
    for p in policies:
        curve = comparison.hit_ratio[p]
        sizes = sorted(curve)
        series[p] = ([s / 1000 for s in sizes], [curve[s] for s in sizes])
    _line_plot(path, series, "cache size (K tokens)", title)


def plot_hit_vs_think_time(
    path: Path, sweep: Mapping[float, Sequence[ReplayResult]], policies: Sequence[str], title: str
) -> None:
    means = sorted(sweep)
    series = {
        p: (means, [next(r.token_hit_ratio for r in sweep[m] if r.policy == p) for m in means])
        for p in policies
    }
    _line_plot(path, series, "mean think time λ_chat (s)", title)


def sweep_table(
    sweep: Mapping[float, Sequence[ReplayResult]], policies: Sequence[str]
) -> tuple[list[str], list[list[str]]]:
    means = sorted(sweep)
    header = ["policy", *(f"λ={m:g}s" for m in means)]
    rows = []
    for p in policies:
        row = [p]
        for m in means:
            by_policy = {r.policy: r for r in sweep[m]}
            base = by_policy.get("lru")
            ratio = by_policy[p].token_hit_ratio
            gain = (
                ""
                if base is None or p == "lru" or not base.token_hit_ratio
                else f" ({ratio / base.token_hit_ratio - 1:+.1%})"
            )
            row.append(f"{ratio * 100:.1f}%{gain}")
        rows.append(row)
    return header, rows


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    write_text_atomically(path, json.dumps(payload, indent=2, default=str) + "\n")
