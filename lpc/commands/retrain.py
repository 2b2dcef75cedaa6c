"""`lpc retrain`: the daily job — train on new logs, promote only a model that is not worse."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lpc.commands.train import add_training_arguments

DESCRIPTION = """\
The daily retraining job. Trains a candidate on the conversations logged in --logs (files in
any loader format; new files since the last run plus every file dated within --window-days;
a file's date is the YYYY-MM-DD or YYYYMMDD in its name, else its modification time), scores
the candidate and the registry's current model on the same held-out half of those logs, and
promotes the candidate only if it is not worse by more than --tolerance. Every candidate is
kept as a new registry version that records the decision and why. One run at a time (a lock
in the registry); all writes are atomic. With --notify-url, a running `lpc serve` is told to
reload the promoted model (it swaps models between batches, dropping no request).

When the selected files are the serving plugin's request logs (requests-YYYY-MM-DD-pid*.jsonl,
LPC_REQUEST_LOG_DIR), they hold no text: the candidate is an access-only model (as lpc train
--trace), fitted on the days before the newest and judged, beside the current model, on the
newest day; labels by --horizon, censored at the logs' end.

exit status: 0 promoted, 3 kept the current model, 4 no new data, 5 another run holds the
lock, 1 failed, 2 bad arguments. See docs/training.md and scripts/lpc-retrain.*.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "retrain",
        help="daily job: retrain, judge, promote",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    data = p.add_argument_group("logs")
    data.add_argument(
        "--logs",
        type=Path,
        required=True,
        help="folder of logged conversations (searched recursively)",
    )
    data.add_argument(
        "--format",
        dest="data_format",
        choices=["sharegpt", "lmsys", "arena", "openai"],
        help="format of the log files (default: recognised per file)",
    )
    data.add_argument("--mode", help="ShareGPT: separate or merge; Arena: a or both")
    data.add_argument(
        "--window-days",
        type=float,
        default=28.0,
        help="also train on files dated within this many days (default: %(default)s)",
    )
    data.add_argument("--force", action="store_true", help="retrain even when no log file is new")
    data.add_argument(
        "--horizon",
        type=float,
        default=180.0,
        help="request logs: label = the conversation's next request within this many seconds "
        "of the request's completion (default: %(default)g, as lpc train --trace)",
    )
    judge = p.add_argument_group("promotion")
    judge.add_argument(
        "--registry",
        type=Path,
        help="model registry (default: $LPC_REGISTRY_DIR, else models/local/registry)",
    )
    judge.add_argument(
        "--metric",
        choices=["roc_auc", "mcc", "macro_f1"],
        default="roc_auc",
        help="held-out metric that decides (default: %(default)s)",
    )
    judge.add_argument(
        "--tolerance",
        type=float,
        default=0.005,
        help="promote unless the candidate is worse by more than this (default: %(default)s)",
    )
    judge.add_argument(
        "--min-eval-samples",
        type=int,
        default=200,
        help="fewer held-out samples than this: keep the current model (default: %(default)s)",
    )
    judge.add_argument(
        "--keep-versions",
        type=int,
        default=20,
        help="registry versions to keep (the current one always stays; default: %(default)s)",
    )
    judge.add_argument(
        "--notify-url",
        help="after a promotion, POST <url>/v1/reload to this `lpc serve` "
        "(e.g. http://127.0.0.1:8476)",
    )
    judge.add_argument(
        "--notify-token-file",
        type=Path,
        help="bearer token for --notify-url (default: $LPC_PREDICTOR_TOKEN)",
    )
    add_training_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from lpc.commands.train import (
        cache_dir_from,
        setup_threads,
        token_counter_for,
        train_config_from,
    )
    from lpc.errors import CommandError, InvalidInputError
    from predictor.embedders import load_embedder
    from predictor.tokens import read_bearer_token
    from training.locations import default_registry_dir
    from training.retrain import RetrainConfig, run_retrain

    train_config, embed = train_config_from(args)
    token = read_bearer_token(args.notify_token_file, "--notify-token-file")  # UserError if bad
    try:
        config = RetrainConfig(
            logs_dir=args.logs,
            registry_dir=args.registry or default_registry_dir(),
            cache_dir=cache_dir_from(args),
            window_days=args.window_days,
            data_format=args.data_format,
            mode=args.mode,
            metric=args.metric,
            tolerance=args.tolerance,
            min_evaluation_samples=args.min_eval_samples,
            keep_versions=args.keep_versions,
            force=args.force,
            notify_url=args.notify_url,
            notify_token=token,
            train=train_config,
            embed=embed,
        )
    except InvalidInputError as error:  # RetrainConfig names the bad field
        raise CommandError(str(error)) from None
    if not args.logs.is_dir():
        raise CommandError(f"--logs {args.logs} is not a folder")
    setup_threads(args)
    log = (
        (lambda m: print(m, file=sys.stderr, flush=True))
        if args.json
        else (lambda m: print(m, flush=True))
    )
    if not args.horizon > 0:
        raise CommandError(f"--horizon must be > 0 seconds, got {args.horizon}")
    from lpc.log_retrain import RequestLogTrainer
    from training.access_fit import AccessFitConfig

    outcome = run_retrain(
        config,
        lambda spec: load_embedder(spec, device=args.device),
        log,
        token_counter=token_counter_for(train_config, args),
        log_trainer=RequestLogTrainer(
            horizon_s=args.horizon, fit=AccessFitConfig(seed=train_config.fit.seed)
        ),
    )
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2))
    else:
        print(
            f"retrain: {outcome.status}: {outcome.reason}"
            + (
                f" (version {outcome.version}, current {outcome.current_version})"
                if outcome.version
                else ""
            )
        )
    return outcome.exit_code
