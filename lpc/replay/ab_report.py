"""`lpc ab`'s outputs: the outcome record and every format it is written in (terminal text,
JSON, markdown, CSV and plots in --out) and the exported trace.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lpc import __version__
from lpc.replay.ab import Comparison
from lpc.replay.ab_options import ABOptions
from lpc.replay.ab_plan import ReplayWorkload, no_training_part_text
from lpc.replay.report import (
    comparison_tables,
    markdown_table,
    plot_hit_vs_size,
    plot_hit_vs_think_time,
    sweep_table,
    terminal_report,
    text_table,
    write_csv,
    write_json,
)
from lpc.replay.simulator import ReplayResult
from lpc.replay.two_tier import TwoTierResult
from lpc.replay.two_tier_intervals import versus_best_text
from lpc.replay.two_tier_report import (
    TABLE_HEADER,
    plot_two_tier,
    two_tier_json,
    two_tier_rows,
    write_two_tier_csv,
)
from predictor.atomic_files import OutputWriteError, write_text_atomically


@dataclass
class ABOutcome:
    """One `lpc ab` run: its options, its figures, how long each stage took, the files written."""

    options: ABOptions
    workload_summary: dict[str, Any]
    results: list[ReplayResult]
    comparison: Comparison
    sweep: dict[float, list[ReplayResult]]
    timings_s: dict[str, float]
    files: dict[str, str]
    two_tier: list[TwoTierResult] = field(default_factory=list)
    # LPC in both tiers against the best other pair, with intervals (`two_tier_intervals`)
    two_tier_versus_best: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "lpc_version": __version__,
            "workload": self.workload_summary,
            "settings": {
                "policies": [p.label for p in self.options.policies],
                "cache_sizes_tokens": list(self.options.cache_sizes_tokens),
                "block_size": self.options.block_size,
                "max_model_len": self.options.max_model_len,
                "scale_per_s": self.options.scale_per_s or "auto",
                "think_time_sweep_s": list(self.options.think_time_sweep_s),
                "sweep_cache_tokens": self.options.sweep_cache_tokens,
            },
            "results": [r.to_dict() for r in self.results],
            "comparison": {
                "hit_ratio": self.comparison.hit_ratio,
                "gain_over_lru": self.comparison.gain_over_lru,
                "gap_closed": self.comparison.gap_closed,
                "gap_closed_belady": self.comparison.gap_closed_belady,
                "size_for_lru_ratio": self.comparison.size_for_lru_ratio,
                "gain_over_lru_ci95": self.comparison.gain_over_lru_ci95,
            },
            "think_time_sweep": {str(k): [r.to_dict() for r in v] for k, v in self.sweep.items()},
            "timings_s": self.timings_s,
            "files": self.files,
        }
        if self.options.tiers is not None:
            out["two_tier"] = two_tier_json(self.options.tiers, self.two_tier)
            out["two_tier"]["versus_best"] = self.two_tier_versus_best
        return out


def export_trace(
    work: ReplayWorkload,
    values: dict[str, list[float | None]],
    files: dict[str, str],
    log: Callable[[str], None],
) -> None:
    """--export-trace: the replayed requests in the project's format, with one source's
    predictions as each line's 'probability' when asked."""
    from lpc.traces.lpc_trace import write_trace

    options = work.options
    assert options.export_trace is not None
    probability = values.get(options.trace_probabilities) if options.trace_probabilities else None
    header = _trace_header(options, work.source_desc)
    # atomic: a failed write leaves no half trace (OutputWriteError naming it)
    write_trace(options.export_trace, work.requests, header, probability)
    files["trace"] = str(options.export_trace)
    log(f"trace: wrote {len(work.requests)} requests to {options.export_trace}")


def _trace_header(options: ABOptions, source: str) -> dict[str, Any]:
    w = options.workload
    if options.trace is not None:
        # A re-exported trace: its timeline came from the trace and the latency model.
        return {
            "created_by": f"lpc {__version__}",
            "source": source,
            "latency": asdict(w.latency),
            "horizon_s": options.horizon_s,
            "max_model_len": options.max_model_len,
            "probability_source": options.trace_probabilities,
        }
    return {
        "created_by": f"lpc {__version__}",
        "source": source,
        "tokenizer": "qwen (ChatML)",
        "mean_think_time_s": w.mean_think_time_s,
        "max_active_conversations": w.max_active_conversations,
        "duration_s": w.duration_s,
        "seed": w.seed,
        "latency": asdict(w.latency),
        "probability_source": options.trace_probabilities,
    }


def write_files(outcome: ABOutcome, out: Path) -> list[OutputWriteError]:
    """Every result file, each written atomically; one that cannot be written is skipped and
    its error returned, so a failure costs that file only and never leaves half of it.
    `outcome.files` lists the files written; results.json comes last and lists them all."""
    policies = [p.label for p in outcome.options.policies]
    writers: list[tuple[str, str, Callable[[Path], None]]] = [
        ("csv", "results.csv", lambda path: write_csv(path, outcome.results)),
        (
            "plot_cache_size",
            "hit_ratio_vs_cache_size.png",
            lambda path: plot_hit_vs_size(
                path, outcome.comparison, policies, "Token hit ratio vs cache size"
            ),
        ),
    ]
    if outcome.sweep:
        rows = [r for results in outcome.sweep.values() for r in results]
        title = f"Token hit ratio vs λ_chat at {outcome.options.sweep_cache_tokens // 1000}K tokens"
        writers += [
            ("sweep_csv", "think_time_sweep.csv", lambda path: write_csv(path, rows)),
            (
                "plot_think_time",
                "hit_ratio_vs_think_time.png",
                lambda path: plot_hit_vs_think_time(path, outcome.sweep, policies, title),
            ),
        ]
    if outcome.two_tier:
        writers += [
            ("two_tier_csv", "two_tier.csv", lambda p: write_two_tier_csv(p, outcome.two_tier)),
            (
                "plot_two_tier",
                "two_tier_hit_ratio.png",
                lambda p: plot_two_tier(p, outcome.two_tier),
            ),
        ]
    # A path that is not valid UTF-8 (a byte such as \xff in a file name) comes back as the
    # bytes it was, as in the terminal, instead of failing the write.
    writers.append(
        (
            "markdown",
            "report.md",
            lambda path: write_text_atomically(
                path, markdown_report(outcome), errors="surrogateescape"
            ),
        )
    )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return [OutputWriteError(out, error, "cannot create")]
    failed: list[OutputWriteError] = []
    for key, name, write in writers:
        try:
            write(out / name)
        except OutputWriteError as error:
            failed.append(error)
        else:
            outcome.files[key] = str(out / name)
    outcome.files["json"] = str(out / "results.json")
    try:
        write_json(out / "results.json", outcome.to_json())
    except OutputWriteError as error:
        del outcome.files["json"]
        failed.append(error)
    return failed


def _scale_text(used: float | None, configured: float | None) -> str:
    if used is None:
        return "n/a"
    how = "estimated from the observed think times" if configured is None else "fixed"
    return f"{used:.4g} per second ({how})"


def markdown_report(outcome: ABOutcome) -> str:
    """report.md: the workload, the comparison tables, the plots and the timings."""
    s = outcome.workload_summary
    policies = [p.label for p in outcome.options.policies]
    if "trace" in s:
        return _markdown_trace_report(outcome)
    lines = [
        "# LPC A/B replay",
        "",
        f"Workload: {s.get('source')}"
        + (
            f", {s['requests']} requests from {s['conversations']} conversations, "
            f"{s['prompt_tokens']:,} prompt tokens; λ_chat {s['mean_think_time_s']:g} s, "
            f"N_conv {s['max_active_conversations']}, window {s['duration_s']} s, "
            f"seed {s['seed']}, "
            f"block size {s['block_size']}."
            if "requests" in s
            else " (closed loop)."
        ),
        "",
        f"LPC decay scale: {_scale_text(s.get('scale_per_s'), outcome.options.scale_per_s)}.",
        "",
    ]
    if "no_training_part" in s:
        lines += [_no_training_part_sentence(s["no_training_part"]), ""]
    if "fitted_policies" in s:
        lines += [*fitted_policies_text(s["fitted_policies"]), ""]
    for title, header, rows in comparison_tables(outcome.comparison, policies):
        lines += [f"## {title}", "", markdown_table(header, rows), ""]
    lines += ["![hit ratio vs cache size](hit_ratio_vs_cache_size.png)", ""]
    if outcome.sweep:
        header, rows = sweep_table(outcome.sweep, policies)
        lines += [
            f"## Hit ratio vs λ_chat at {outcome.options.sweep_cache_tokens // 1000}K tokens "
            "(gain over LRU)",
            "",
            markdown_table(header, rows),
            "",
            "![hit ratio vs think time](hit_ratio_vs_think_time.png)",
            "",
        ]
    lines += _two_tier_markdown(outcome)
    lines += ["## Timings", "", *(f"- {k}: {v:.1f}" for k, v in outcome.timings_s.items()), ""]
    return "\n".join(lines)


def _two_tier_markdown(outcome: ABOutcome) -> list[str]:
    if not outcome.two_tier:
        return []
    return [
        "## Two tiers (GPU prefix cache + CPU offload tier)",
        "",
        markdown_table(TABLE_HEADER, two_tier_rows(outcome.two_tier)),
        "",
        "![two tiers](two_tier_hit_ratio.png)",
        "",
        *_versus_best_markdown(outcome),
    ]


def _versus_best_markdown(outcome: ABOutcome) -> list[str]:
    if not outcome.two_tier_versus_best:
        return []
    return [
        "### LPC in both tiers against the best other pair (95 % paired interval)",
        "",
        *(f"- {line}" for line in versus_best_text(outcome.two_tier_versus_best)),
        "",
    ]


def trace_description(summary: dict[str, Any]) -> list[str]:
    """The trace's import, split and linkage in sentences (markdown report and terminal)."""
    t = summary["trace"]
    split = t["split"]
    lines = [
        f"Trace: {summary['source']} ({t['format']}), {summary['replayed_requests']} requests "
        f"over {summary['span_s']:.0f} s, replayed at block size {summary['block_size']}.",
        f"Split at {split['cut_after_start_s']:.0f} s: "
        f"{split['train_requests']} training requests warm the cache, hit ratios count the "
        f"{split['eval_requests']} evaluation requests ({summary['prompt_tokens']:,} prompt "
        "tokens).",
        f"Peak in-flight tokens: {summary['peak_in_flight_tokens']:,}.",
    ]
    if "linkage" in t:
        link = t["linkage"]
        lines.append(
            f"Prefix linkage (shared-block fan-out {link['shared_fanout']}): "
            f"{link['linked_requests']} of {link['requests']} requests "
            f"({link['linked_share']:.1%}) continue an earlier one; "
            f"{link['conversations']} conversations, {link['multi_turn_conversations']} with "
            f"several turns (at most {link['max_turns']}); {link['branched_parents']} requests "
            f"continued more than once; {link['shared_blocks']} shared blocks."
        )
    if "request_log" in t:
        engine = t["request_log"]
        lines.append(
            f"Request log: {engine['requests']} requests in {engine['files']} file(s); the "
            f"engine's token hit ratio over all of them {engine['engine_token_hit_ratio']:.2%} "
            f"({engine['cached_tokens']} of {engine['prompt_tokens']} prompt tokens cached)."
        )
    if "orphans" in t:
        lines.append(
            f"Conversations from chat ids; {t['orphans']} requests whose parent is not in the "
            f"trace start their own. Types: {t.get('types')}."
        )
    if "horizon_s" in t:
        lines.append(
            f"Oracle label: next request of the conversation within {t['horizon_s']:g} s of "
            f"completion; {t['continuing_labels']} requests continue, of which "
            f"{t['censored_labels']} are censored at the trace's end (counted as continuing)."
        )
    if t.get("cut_to_max_model_len"):
        lines.append(
            f"{t['cut_to_max_model_len']} requests cut to --max-model-len "
            f"{summary.get('max_model_len')} tokens."
        )
    if t.get("skipped_last_lines"):
        n, files = t["skipped_last_lines"], ", ".join(t.get("cut_last_line_files", []))
        lines.append(f"Skipped {n} cut last line{'s' if n > 1 else ''} in {files}.")
    if "no_training_part" in summary:
        lines.append(_no_training_part_sentence(summary["no_training_part"]))
    if "fitted_policies" in summary:
        lines += fitted_policies_text(summary["fitted_policies"])
    return lines


def fitted_policies_text(report: dict[str, Any]) -> list[str]:
    """One sentence per fitted policy: what its training part gave (details in the JSON)."""
    lines = []
    if "session-ref" in report:
        t = report["session-ref"]
        lines.append(
            f"session-ref: idle timeout {t['timeout_s']:.0f} s, the {t['quantile']:g} quantile "
            f"of {t['gaps']} think times of {t['fitted_on']}."
        )
    if "wa" in report:
        w = report["wa"]
        cats = w["categories"]
        parts = ", ".join(
            f"{c} p={f['p']:.2f}/{f['mean_reuse_s']:.0f} s" for c, f in list(cats.items())[:8]
        )
        more = f" and {len(cats) - 8} more" if len(cats) > 8 else ""
        lines.append(
            f"wa: reuse probability / mean reuse time per category, fitted on {w['fitted_on']}: "
            f"{parts}{more} (all: p={w['default']['p']:.2f}/"
            f"{w['default']['mean_reuse_s']:.0f} s)."
        )
    return lines


def _no_training_part_sentence(note: dict[str, Any]) -> str:
    text = no_training_part_text(note)
    return f"{text[0].upper()}{text[1:]}."


def _markdown_trace_report(outcome: ABOutcome) -> str:
    s = outcome.workload_summary
    policies = [p.label for p in outcome.options.policies]
    lines = ["# LPC A/B replay of a request trace", ""]
    lines += [*(f"- {line}" for line in trace_description(s)), ""]
    lines += [
        f"LPC decay scale: {_scale_text(s.get('scale_per_s'), outcome.options.scale_per_s)}.",
        "",
    ]
    for title, header, rows in comparison_tables(outcome.comparison, policies):
        lines += [f"## {title}", "", markdown_table(header, rows), ""]
    lines += ["![hit ratio vs cache size](hit_ratio_vs_cache_size.png)", ""]
    lines += _two_tier_markdown(outcome)
    lines += ["## Timings", "", *(f"- {k}: {v:.1f}" for k, v in outcome.timings_s.items()), ""]
    return "\n".join(lines)


def summary_text(outcome: ABOutcome) -> str:
    """The terminal report: the trace or fitted policies, then every table."""
    policies = [p.label for p in outcome.options.policies]
    text = terminal_report(outcome.comparison, policies)
    summary = outcome.workload_summary
    if "trace" in summary:
        text = "\n".join(trace_description(summary)) + "\n\n" + text
    elif "fitted_policies" in summary:
        text = "\n".join(fitted_policies_text(summary["fitted_policies"])) + "\n\n" + text
    if outcome.sweep:
        header, rows = sweep_table(outcome.sweep, policies)
        text += "\n\n" + text_table(
            f"Token hit ratio vs λ_chat at {outcome.options.sweep_cache_tokens // 1000}K tokens",
            header,
            rows,
        )
    if outcome.two_tier:
        text += "\n\n" + text_table(
            "Two tiers: token hit ratio by tier, TTFT and prefill saved",
            TABLE_HEADER,
            two_tier_rows(outcome.two_tier),
        )
        if outcome.two_tier_versus_best:
            text += "\n\nLPC in both tiers against the best other pair (95 % paired interval):\n"
            text += "\n".join(versus_best_text(outcome.two_tier_versus_best))
    return text


def outcome_json(outcome: ABOutcome) -> str:
    """Every figure as JSON (`lpc ab --json`)."""
    return json.dumps(outcome.to_json(), indent=2, default=str)
