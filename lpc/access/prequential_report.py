"""Tables of a prequential run: per window, the replay's gains and the models' quality.

Markdown and terminal share the rows; every gain carries its 95 % interval, and each cell
says whether the interval lies above LRU, below it, or spans it (docs/results.md,
"Prequential windows", rule 5).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lpc.replay.report import markdown_table


def _size(tokens: int) -> str:
    return f"{tokens / 1e6:g}M"


def verdict(interval: Sequence[float] | None) -> str:
    """'above', 'below' or 'level' by the gain's 95 % interval; '' without one."""
    if interval is None:
        return ""
    low, high = interval
    return "above" if low > 0 else "below" if high < 0 else "level"


def _gain_cell(gain: float | None, interval: Sequence[float] | None) -> str:
    if gain is None:
        return "—"
    if interval is None:
        return f"{gain:+.1%}"
    return f"{gain:+.1%} [{interval[0]:+.1%}, {interval[1]:+.1%}]"


def replay_rows(window: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Hit ratio of every policy, then each policy's gain over LRU with its interval and the
    share of the LRU→Belady gap it closes, one column per cache size."""
    comparison = window["replay"]["comparison"]
    ratio = comparison["hit_ratio"]
    sizes = sorted(int(s) for s in ratio["lru"])
    header = ["", *(_size(s) for s in sizes)]
    rows = [
        [f"{p} hit ratio", *(f"{ratio[p][_key(ratio[p], s)]:.1%}" for s in sizes)] for p in ratio
    ]
    for policy in ratio:
        if policy in ("lru", "belady"):
            continue
        gains = comparison["gain_over_lru"][policy]
        cis = comparison["gain_over_lru_ci95"].get(policy, {})
        rows.append(
            [
                f"{policy} gain over LRU",
                *(_gain_cell(gains[_key(gains, s)], cis.get(_key(cis, s))) for s in sizes),
            ]
        )
        gap = comparison["gap_closed_belady"].get(policy, {})
        rows.append(
            [
                f"{policy} share of LRU→Belady gap",
                *(_share(gap.get(_key(gap, s))) for s in sizes),
            ]
        )
    return header, rows


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _key(mapping: dict, size: int) -> Any:
    """JSON turned the sizes into strings; a live outcome keeps ints."""
    return size if size in mapping else str(size)


def verdicts(windows: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Per policy: the window×size cells where it is above / level / below LRU."""
    out: dict[str, dict[str, list[str]]] = {}
    for window in windows:
        name = window_label(window)
        comparison = window["replay"]["comparison"]
        for policy, cis in comparison["gain_over_lru_ci95"].items():
            if policy == "belady":
                continue
            for size, interval in cis.items():
                kind = verdict(interval)
                if kind:
                    cells = out.setdefault(policy, {"above": [], "level": [], "below": []})
                    cells[kind].append(f"{name} {_size(int(size))}")
    return out


def policy_rows(
    windows: Sequence[dict[str, Any]], policy: str, gap: bool = False
) -> tuple[list[str], list[list[str]]]:
    """One policy across the windows: its gain over LRU with the interval per cache size (or,
    for lru and belady, the hit ratio; with `gap`, the share of the LRU→Belady gap closed)."""
    sizes = sorted(int(s) for s in windows[0]["replay"]["comparison"]["hit_ratio"]["lru"])
    header = ["window", *(_size(s) for s in sizes)]
    rows = []
    for window in windows:
        comparison = window["replay"]["comparison"]
        if policy in ("lru", "belady"):
            ratio = comparison["hit_ratio"][policy]
            cells = [f"{ratio[_key(ratio, s)]:.1%}" for s in sizes]
        elif gap:
            shares = comparison["gap_closed_belady"].get(policy, {})
            cells = [_share(shares.get(_key(shares, s))) for s in sizes]
        else:
            gains = comparison["gain_over_lru"][policy]
            cis = comparison["gain_over_lru_ci95"].get(policy, {})
            cells = [_gain_cell(gains[_key(gains, s)], cis.get(_key(cis, s))) for s in sizes]
        rows.append([window_label(window), *cells])
    return header, rows


def window_label(window: dict[str, Any]) -> str:
    w = window["window"]
    return f"{w['start_s'] / 60:g}–{w['end_s'] / 60:g} min"


def _number(value: float | None) -> str:
    """Three decimals; '—' for a figure the window cannot give (NaN: e.g. an AUC at 600 s
    when no release of the window is followed that long before the trace ends)."""
    return "—" if value is None or value != value else f"{value:.3f}"


def _ci(ci: Sequence[float] | None) -> str:
    return "" if ci is None else f" [{ci[0]:.3f}, {ci[1]:.3f}]"


def quality_rows(windows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """One row per window: the classifier's AUC at 180 s, the hazard model's C / IBS / AUC at
    60, 180, 600 s, each with its 95 % interval where the window's JSON has one, and
    Kaplan–Meier per turn's C beside it."""
    header = [
        "window",
        "releases (classifier / hazard)",
        "classifier AUC 180 s",
        "hazard C",
        "hazard IBS",
        "hazard AUC 60 / 180 / 600",
        "KM per turn C / AUC 180",
    ]
    rows = []
    for window in windows:
        clf, hz = window["quality"]["classifier"], window["quality"]["return_model"]
        model, km = hz["model"], hz["km_per_turn"]
        auc = model["auc"]
        ci = model.get("ci95") or {}
        auc_ci = ci.get("auc") or {}
        rows.append(
            [
                window_label(window),
                f"{clf['samples']:,} / {hz['samples']:,}",
                f"{clf['roc_auc']['value']:.3f}{_ci(clf['roc_auc']['ci95'])}",
                f"{model['concordance']:.3f}{_ci(model['concordance_ci95'])}",
                f"{_number(model['integrated_brier'])}{_ci(ci.get('integrated_brier'))}",
                " / ".join(f"{_number(auc[t])}{_ci(auc_ci.get(t))}" for t in ("60", "180", "600")),
                f"{_number(km['concordance'])} / {_number(km['auc']['180'])}",
            ]
        )
    return header, rows


def markdown_report(windows: Sequence[dict[str, Any]]) -> str:
    lines = ["# Prequential evaluation", ""]
    header, rows = quality_rows(windows)
    lines += ["## Model quality on each window's releases", "", markdown_table(header, rows), ""]
    policies = list(windows[0]["replay"]["comparison"]["hit_ratio"]) if windows else []
    for policy in policies:
        what = "hit ratio" if policy in ("lru", "belady") else "gain over LRU, 95 % interval"
        header, rows = policy_rows(windows, policy)
        lines += [f"## {policy}: {what}", "", markdown_table(header, rows), ""]
        if policy not in ("lru", "belady") and "belady" in policies:
            header, rows = policy_rows(windows, policy, gap=True)
            lines += [f"## {policy}: share of the LRU→Belady gap closed", ""]
            lines += [markdown_table(header, rows), ""]
    for window in windows:
        workload = window["replay"]["workload"]
        lines += [
            f"## Window {window_label(window)}",
            "",
            f"{workload['requests']:,} counted requests from {workload['conversations']:,} "
            f"conversations ({workload['prompt_tokens']:,} prompt tokens); "
            f"{workload['replayed_requests']:,} replayed.",
            "",
        ]
        header, rows = replay_rows(window)
        lines += [markdown_table(header, rows), ""]
    lines += ["## Above / level / below LRU (95 % interval)", ""]
    for policy, cells in verdicts(windows).items():
        lines.append(
            f"- {policy}: above in {len(cells['above'])}, level in {len(cells['level'])}, "
            f"below in {len(cells['below'])}"
            + (f" ({', '.join(cells['below'])})" if cells["below"] else "")
        )
    lines.append("")
    return "\n".join(lines)
