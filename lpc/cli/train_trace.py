"""`lpc train --trace`: the flags and the run of access-only training on a request trace."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lpc.cli.arg_types import positive_float, positive_int, split_at
from lpc.errors import UserError


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    from predictor.access_features import features_help
    from training.access_defaults import (
        DEFAULT_ACCESS_ENSEMBLE,
        DEFAULT_ACCESS_HORIZON_S,
        DEFAULT_TEACHER_SHARE,
    )

    g = p.add_argument_group(
        "access-feature model on a request trace (--trace)",
        "No text and no embedder: of the other flags only --hidden (each ensemble member's; "
        "default 48,48,48), --seed, --threads, --out, --overwrite and --json apply "
        "(docs/training.md §8).",
    )
    g.add_argument(
        "--trace",
        help="train an access-only model on this request trace instead of a chat data set: "
        "a JSONL file (gzip or plain), a folder of request logs or a bundled one ('mooncake'); "
        "see docs/traces.md",
    )
    g.add_argument(
        "--trace-format",
        choices=["mooncake", "bailian", "lpc"],
        help="format of --trace (default: recognised from its first line)",
    )
    g.add_argument(
        "--split-at",
        type=split_at,
        default=0.5,
        help="requests before this point are the training part (its last --validation-share "
        "by time validates), the rest the evaluation part; a fraction of the span (< 1) or "
        "seconds after the first arrival (default: %(default)s, as lpc ab)",
    )
    g.add_argument(
        "--horizon",
        type=positive_float,
        default=DEFAULT_ACCESS_HORIZON_S,
        help="label: the conversation's next request arrives within this many seconds of the "
        "request's completion; requests whose horizon runs past the end of their part's data "
        "with no next request are dropped (default: %(default)g, from LRU's eviction age at "
        "the default Mooncake cache sizes; docs/training.md)",
    )
    g.add_argument(
        "--validation-share",
        type=float,
        default=0.3,
        help="share of the training part's time span, at its end, used for validation "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--ensemble",
        type=positive_int,
        default=DEFAULT_ACCESS_ENSEMBLE,
        help="average this many MLPs (seeds --seed, --seed + 1, …), stored as one MLP with "
        "block-diagonal weights (default: %(default)s)",
    )
    g.add_argument(
        "--no-refit",
        dest="refit",
        action="store_false",
        help="serve the members as early-stopped on the fitting slice, instead of retraining "
        "each on the whole training part for its best epoch count",
    )
    g.add_argument(
        "--teacher-share",
        type=float,
        default=DEFAULT_TEACHER_SHARE,
        help="fit the MLP to this share of the probability given by gradient-boosted trees "
        "(the reference's kind with twice the trees, fitted on the same training rows) plus the "
        "rest of the 0/1 label: 1 mimics the trees, 0 trains on the labels alone (default: "
        "%(default)g; docs/results.md)",
    )
    g.add_argument(
        "--access-features",
        help="comma-separated access features, any of (when an engine knows it): "
        f"{features_help('table', 'state')} (default: every one the trace can feed; "
        "docs/training.md §8)",
    )


def _print_report(report: dict) -> None:
    split = report["split"]
    print(
        f"trace {report['trace']} ({report['format']}): {report['requests']} requests; "
        f"training part before {split['cut_after_start_s']:.0f} s; horizon "
        f"{report['horizon_s']:g} s"
    )
    for part, counts in report["samples"].items():
        print(
            f"  {part}: {counts['samples']} samples ({counts['positive_rate']:.1%} continue), "
            f"{counts['censored']} censored and dropped"
        )
    print(f"features: {', '.join(report['features'])}")
    print()
    print(f"{'evaluation part':<26}{'AUC':>8}{'MCC':>8}{'macro-F1':>10}{'Brier':>8}")
    labels = {
        "mlp": f"MLP {report['ensemble']}×{'x'.join(map(str, report['hidden_sizes']))} (served)",
        "gbm": "gradient boosting (ref.)",
        "turns_only": "turns only",
    }
    for key, label in labels.items():
        m = report["metrics"].get(key)
        if m:
            print(
                f"{label:<26}{m['roc_auc']:>8.3f}{m['mcc']:>8.3f}{m['macro_f1']:>10.3f}"
                f"{m['brier']:>8.3f}"
            )
    validation = report["validation"]
    print(
        f"validation slice AUC (trained on the fitting slice only): MLP "
        f"{validation['mlp']['roc_auc']:.3f}, gradient boosting {validation['gbm']['roc_auc']:.3f}"
    )
    for note in report["notes"]:
        print(f"note: {note}")
    t = report["timings_s"]
    refit = " (then refitted on the whole training part)" if report["refit"] else ""
    if report["teacher_share"] > 0:
        refit += f"; targets {report['teacher_share']:.0%} gradient-boosted trees' probability"
    print(
        f"\nepochs {'/'.join(map(str, report['member_epochs']))}{refit}; "
        f"load {t['load_s']:.1f} s, fit {t['fit_s']:.1f} s, total {t['total_s']:.1f} s"
    )
    if "out" in report:
        print(f"wrote {report['out']}")


def run_trace(args: argparse.Namespace) -> int:
    from lpc.access.training import TraceTrainOptions, train_on_trace
    from lpc.errors import CommandError
    from predictor.atomic_files import check_output_folder
    from training.access_fit import AccessFitConfig

    if args.out is None:
        raise CommandError("--trace writes an access-only model: give --out FOLDER")
    if args.out.exists() and not args.overwrite:
        raise CommandError(f"--out {args.out} exists; pass --overwrite to replace it")
    check_output_folder(args.out.parent, "--out")  # staged beside --out: before the training
    if not 0 < args.validation_share < 1:
        raise CommandError(f"--validation-share must be in (0, 1), got {args.validation_share}")
    if not 0 <= args.teacher_share <= 1:
        raise CommandError(f"--teacher-share must be in [0, 1], got {args.teacher_share}")
    features = None
    if args.access_features:
        features = tuple(n.strip() for n in args.access_features.split(",") if n.strip())
    options = TraceTrainOptions(
        trace=args.trace,
        trace_format=args.trace_format,
        split_at=args.split_at,
        horizon_s=args.horizon,
        validation_fraction=args.validation_share,
        features=features,
        fit=AccessFitConfig(
            hidden_sizes=tuple(args.hidden) if args.hidden else AccessFitConfig.hidden_sizes,
            ensemble=args.ensemble,
            refit=args.refit,
            teacher_share=args.teacher_share,
            seed=args.seed,
            threads=args.threads or AccessFitConfig.threads,
        ),
    )
    try:
        report = train_on_trace(options, Path(args.out))
    except UserError as error:  # trace, feature, horizon and split problems
        raise CommandError(str(error)) from None
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        _print_report(report)
    if "write_error" in report:  # the figures are out; the artifact is not: exit 2, not 0
        raise CommandError(f"{report['write_error']} (no model written; the figures are above)")
    return 0
