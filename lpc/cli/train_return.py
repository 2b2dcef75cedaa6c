"""`lpc train-return`: the return-time model on a request trace, scored beside its baselines."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lpc.cli import extras
from lpc.cli.arg_types import non_negative_int, positive_int, split_at
from lpc.errors import CommandError, UserError
from predictor.json_values import finite_or_none

DESCRIPTION = """\
Train a censoring-aware model of the time from a request's completion to its conversation's
next request (a discrete-time hazard over a log-spaced grid, with the share that does not
return within the grid) from the access features of a request trace's training part. The
grid and the architecture are chosen on the training part's validation slice; a request
without a next one is censored at its part's end, never counted as an ending. Scored on the
evaluation part (concordance, integrated Brier score, AUC at 60 / 180 / 600 s) beside
Kaplan-Meier per turn and the shipped 180-s classifier. See docs/results.md ("When a
conversation returns").
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train-return",
        help="train the return-time (survival) model on a request trace",
        description=DESCRIPTION,
    )
    p.add_argument("--trace", default="mooncake", help="a request trace (default: %(default)s)")
    p.add_argument("--trace-format", choices=["mooncake", "bailian", "lpc"])
    p.add_argument(
        "--split-at",
        type=split_at,
        default=0.5,
        help="the training part's end, as `lpc train --trace` (default: %(default)s)",
    )
    p.add_argument(
        "--validation-share",
        type=float,
        default=0.3,
        help="share of the training part's span, at its end, that validates the choices "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--classifier",
        type=Path,
        default=None,
        help="the horizon classifier scored as a baseline (default: the shipped "
        "models/mooncake-access beside the installed package, from any working directory)",
    )
    p.add_argument("--no-classifier", action="store_true", help="score no classifier")
    p.add_argument(
        "--max-epochs",
        type=positive_int,
        default=200,
        help="epochs at most per candidate (early stopping on the validation slice)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-distil",
        action="store_true",
        help="train on the likelihood only: no gradient-boosted teacher, no distilled "
        "student candidates",
    )
    p.add_argument(
        "--intervals",
        type=non_negative_int,
        default=1000,
        metavar="RESAMPLES",
        help="bootstrap resamples over the evaluation part's conversations for the quality "
        "figures' 95 %% intervals, paired across sources; 0: none (default: %(default)s)",
    )
    p.add_argument(
        "--bench",
        action="store_true",
        help="also time the numpy predictor per release (µs)",
    )
    p.add_argument("--out", type=Path, help="write the artifact into this folder")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _print_report(report: dict) -> None:
    split = report["split"]
    print(
        f"trace {report['trace']} ({report['format']}): {report['requests']} requests; "
        f"training part before {split['cut_after_start_s']:.0f} s"
    )
    for part, counts in report["samples"].items():
        print(
            f"  {part}: {counts['samples']} releases, {counts['returned']} returns seen, "
            f"{counts['censored']} censored"
        )
    if report.get("validation_slice") == "releases":
        print(
            "  (the last share of the training part's span holds no release: the validation "
            "slice is its last share of releases instead)"
        )
    grid = report["grid_s"]
    print(
        f"grid: {len(grid) - 1} points, {grid[1]:g} s … {grid[-1]:g} s; hidden "
        f"{report['hidden_sizes'] or 'none (linear)'}; {report['epochs']} epochs; "
        f"features known at {report['known_at']}"
    )
    e = report["ensemble"]
    print(
        f"ensemble of {e['members']}: validation NLL {e['ensemble_val_nll']:.4f} against "
        f"{e['single_val_nll']:.4f} alone; served: {report['members']} network(s)"
    )
    d = report["distillation"]
    if d.get("reason"):
        print(f"distillation skipped: {d['reason']}")
    if d.get("tried"):
        c = d["chosen"]
        print(
            f"distilled from gradient-boosted trees ({d['teacher_iterations']} iterations, "
            f"validation NLL {d['teacher_val_nll']:.4f}): student {c['hidden'] or 'linear'} "
            f"{c['val_nll']:.4f} against {d['likelihood_val_nll']:.4f} trained on the "
            f"likelihood; served: {report['recipe']}"
        )
    print()
    print(
        f"{'evaluation part':<22}{'C':>7}{'IBS':>7}{'AUC60':>7}{'AUC180':>8}{'AUC600':>8}"
        f"{'BS180':>7}"
    )
    labels = {"model": "hazard model", "km_per_turn": "KM per turn", "classifier": "180-s clf."}
    for key, label in labels.items():
        q = report["quality"].get(key)
        if q is None:
            continue
        auc, brier = q["auc"], q["brier"]
        print(
            f"{label:<22}{_fmt(q['concordance']):>7}{_fmt(q['integrated_brier']):>7}"
            f"{_fmt(auc.get('60')):>7}{_fmt(auc.get('180')):>8}{_fmt(auc.get('600')):>8}"
            f"{_fmt(brier.get('180')):>7}"
        )
    _print_intervals(report.get("quality_ci95"), labels)
    if "bench" in report:
        b = report["bench"]
        print(
            f"\npredictor: {b['one_release_us']:.1f} µs per release (curve_one), "
            f"{b['batched_us_per_row']:.2f} µs per row batched, p_return_within "
            f"{b['p_return_within_us']:.1f} µs"
        )
    t = report["timings_s"]
    print(f"load {t['load_s']:.1f} s, fit {t['fit_s']:.1f} s, total {t['total_s']:.1f} s")
    if "out" in report:
        print(f"wrote {report['out']}")


def _interval(interval: list[float] | None) -> str:
    return "—" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def _print_intervals(intervals: dict | None, labels: dict[str, str]) -> None:
    """The 95 % intervals of the quality table, and the paired differences between sources."""
    if not intervals:
        return
    print(
        f"\n95 % intervals ({intervals['resamples']} resamples of the evaluation part's "
        "conversations; differences paired):"
    )
    rows = [(labels.get(k, k), q) for k, q in intervals["sources"].items()]
    for pair, q in intervals["differences"].items():
        a, b = pair.split(" - ")
        rows.append((f"{labels.get(a, a)} − {labels.get(b, b)}", q))
    for label, q in rows:
        figures = [f"C {_interval(q.get('concordance'))}"]
        if q.get("integrated_brier") is not None:
            figures.append(f"IBS {_interval(q['integrated_brier'])}")
        figures += [f"AUC{at} {_interval(v)}" for at, v in q.get("auc", {}).items()]
        print(f"  {label}: " + ", ".join(figures))


def run(args: argparse.Namespace) -> int:
    extras.require("train")
    from lpc.access.return_training import (
        SHIPPED_CLASSIFIER,
        ReturnTrainOptions,
        train_return_on_trace,
    )
    from predictor.atomic_files import check_output_folder
    from training.return_fit import ReturnFitConfig

    if args.out is not None and args.out.exists() and not args.overwrite:
        raise CommandError(f"--out {args.out} exists; pass --overwrite to replace it")
    if args.out is not None:  # the artifact is staged beside --out: its folder must take it
        check_output_folder(args.out.parent, "--out")
    if not 0 < args.validation_share < 1:
        raise CommandError(f"--validation-share must be in (0, 1), got {args.validation_share}")
    options = ReturnTrainOptions(
        trace=args.trace,
        trace_format=args.trace_format,
        split_at=args.split_at,
        validation_fraction=args.validation_share,
        classifier=None if args.no_classifier else (args.classifier or SHIPPED_CLASSIFIER),
        fit=ReturnFitConfig(max_epochs=args.max_epochs, seed=args.seed, distil=not args.no_distil),
        intervals=args.intervals,
    )
    try:
        outcome = train_return_on_trace(options, args.out)
    except UserError as error:
        raise CommandError(str(error)) from None
    report = outcome.report
    if args.bench:
        from lpc.benchmarks.return_time import bench_return_predictor

        report["bench"] = bench_return_predictor(
            outcome.predictor, outcome.evaluation_features
        ).to_dict()
    if args.json:
        json.dump(finite_or_none(report), sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        _print_report(report)
    if "write_error" in report:  # the figures are out; the artifact is not: exit 2, not 0
        raise CommandError(f"{report['write_error']} (no model written; the figures are above)")
    return 0
