"""`lpc retrain`: the daily job — train on new logs, promote only a model that is not worse."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lpc.cli import extras
from lpc.cli.arg_types import positive_int, split_at
from lpc.cli.train import add_training_arguments

DESCRIPTION = """\
The daily retraining job. Trains a candidate on the conversations logged in --logs (files in
any loader format; new files since the last run plus every file dated within --window-days;
a file's date is the YYYY-MM-DD or YYYYMMDD in its name, else its modification time), scores
the candidate and the registry's current model on the same held-out half of those logs, and
promotes the candidate only if it is not worse by more than --tolerance. Every candidate is
kept as a new registry version that records the decision and why. One run at a time (a lock
in the registry); all writes are atomic. With --notify-url, a running `lpc serve` is told to
reload the promoted model (it swaps models between batches, dropping no request).

When the selected files are request traces, recognised by content (Mooncake, Bailian or the
project's JSONL, the serving plugin's request logs requests-YYYY-MM-DD-pid*.jsonl included;
.jsonl or .jsonl.gz), they hold no text: the candidate is an access-only model (as lpc train
--trace) and the files are read as one trace of one format (project JSONL merged by time,
Mooncake files in date order on one clock, Bailian merged by timestamp). The split is in
time, never shuffled: with absolute UTC times spanning two days or more, the newest UTC day
is the evaluation part (yesterday's model judged on today's traffic); otherwise the last half
of the span; either is refused (exit 2) when it holds fewer requests than --min-eval-samples,
saying so (--split-at sets the cut instead). Labels by --horizon; a request whose horizon runs
past the data's end is censored (dropped and counted, never labelled "ended"). A current model the
trace cannot feed (a text model) is reported and the candidate promoted. A folder mixing
conversation and trace files, or trace formats, is refused (exit 2). Of the embedder and
training flags, trace files use only --hidden (default 32,32), --seed and --threads.

On trace files the job then retrains the return-time model (as lpc train-return) on the same
split, into its own registry (--return-registry), judged with the current return model on
the same evaluation part by the integrated Brier score (lower is better; --return-tolerance;
concordance reported). Its outcome is the `return_model` section; --no-return-model skips it,
and conversation logs skip it (no request times). The exit status stays the access model's
decision; a failure of the return half is reported there and changes neither the access
model's result nor the current return model. Files count as trained on (the next run's "new"
starts after them) only once both models have decided on them: after a return half that
failed, was locked out or was killed, the next run takes the same files again.

With --ray (pip install 'lpc[ray]') a fleet's request logs (the project's JSONL) are read on
Ray: each file is parsed in a task of its own, the driver merges them in the serial order
(a conversation spanning files stays one), and the request table is built per group of
conversations, a task each; locally with --workers CPUs, or on the cluster at --ray-address.
The samples and the model equal the serial run's. Mooncake and Bailian files are read
serially. The `data.read` section says how the files were read, with each Ray worker's peak
memory.

exit status (the access model's decision): 0 promoted, 3 kept the current model, 4 no new
data, 5 another run holds the lock, 1 failed, 2 bad arguments or log files that cannot be
read (the message names the file and line). See docs/training.md and scripts/lpc-retrain.*.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "retrain",
        help="daily job: retrain, judge, promote",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_logs_args(p.add_argument_group("logs"))
    _add_promotion_args(p.add_argument_group("promotion"))
    _add_return_args(p.add_argument_group("return-time model (trace files)"))
    _add_ray_args(p.add_argument_group("reading a fleet's request logs on Ray"))
    add_training_arguments(p)
    p.set_defaults(run=run)


def _add_logs_args(data: argparse._ArgumentGroup) -> None:
    data.add_argument(
        "--logs",
        type=Path,
        required=True,
        help="folder of logged conversations or of trace files (searched recursively)",
    )
    data.add_argument(
        "--format",
        dest="data_format",
        choices=["sharegpt", "lmsys", "arena", "openai"],
        help="format of conversation log files (default: recognised per file; trace "
        "files are always recognised by content)",
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
        help="trace files: label = the conversation's next request arrives within this many "
        "seconds of the request's completion (default: %(default)g, as lpc train --trace)",
    )
    data.add_argument(
        "--split-at",
        type=split_at,
        help="trace files: requests before this point are the training part, the rest the "
        "evaluation part; a fraction of the span (< 1) or seconds after the first arrival, as "
        "lpc train --trace (default: the newest UTC day when the trace's times are absolute "
        "UTC times spanning two days or more, else 0.5)",
    )


def _add_promotion_args(judge: argparse._ArgumentGroup) -> None:
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


def _add_return_args(returns: argparse._ArgumentGroup) -> None:
    returns.add_argument(
        "--return-registry",
        type=Path,
        help="registry of the return-time model (default: $LPC_RETURN_REGISTRY_DIR, else "
        "the access registry's sibling <registry>-return)",
    )
    returns.add_argument(
        "--return-tolerance",
        type=float,
        default=0.002,  # training.return_retrain.DEFAULT_RETURN_TOLERANCE (not imported here:
        # the parser is built at every `lpc` start, training's modules load pandas)
        help="promote unless the candidate's integrated Brier score is higher than the "
        "current return model's by more than this (default: %(default)s)",
    )
    returns.add_argument(
        "--return-max-epochs",
        type=positive_int,
        default=200,
        help="epochs at most per return-model candidate, as lpc train-return --max-epochs "
        "(default: %(default)s)",
    )
    returns.add_argument(
        "--no-return-model", action="store_true", help="do not retrain the return-time model"
    )


def _add_ray_args(ray: argparse._ArgumentGroup) -> None:
    ray.add_argument(
        "--ray",
        action="store_true",
        help="parse request-log files one Ray task each and build their request table per "
        "group of conversations (needs lpc[ray]); the same samples and model as without it",
    )
    ray.add_argument(
        "--ray-address",
        help="with --ray: the cluster to run on (ray://host:10001, or 'auto'); default: a "
        "local Ray with --workers CPUs",
    )
    ray.add_argument(
        "--workers",
        type=positive_int,
        default=2,
        help="with --ray: CPUs of the local Ray (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    extras.require("train")
    from lpc.cli.train import setup_threads, token_counter_for
    from lpc.errors import CommandError
    from predictor.embedders import load_embedder
    from training.retrain import BAD_INPUT, run_retrain

    config = config_from(args)
    check_paths(args, config)
    setup_threads(args)
    log = (
        (lambda m: print(m, file=sys.stderr, flush=True))
        if args.json
        else (lambda m: print(m, flush=True))
    )
    check_trace_flags(args)
    outcome = run_retrain(
        config,
        lambda spec: load_embedder(spec, device=args.device),
        log,
        token_counter=token_counter_for(config.train, args),
        log_trainer=trace_log_trainer(args, log),
    )
    if outcome.status == BAD_INPUT and not args.json:
        raise CommandError(outcome.reason)  # one line, exit 2
    print_outcome(outcome, args.json)
    return outcome.exit_code


def config_from(args: argparse.Namespace):
    """The job's `RetrainConfig` from the flags; a bad value or --notify-url is a
    `CommandError` naming the flag."""
    from lpc.cli.train import cache_dir_from, train_config_from
    from lpc.errors import CommandError, InvalidInputError
    from predictor.bearer_token import read_bearer_token
    from predictor.client import check_predictor_url
    from training.locations import default_registry_dir
    from training.retrain import RetrainConfig

    train_config, embed = train_config_from(args)
    token = read_bearer_token(args.notify_token_file, "--notify-token-file")  # UserError if bad
    if args.notify_url is not None:  # else httpx.InvalidURL after the training, as a warning
        try:
            check_predictor_url(args.notify_url)
        except ValueError as error:
            raise CommandError(f"--notify-url {error}") from None
    registry = args.registry or default_registry_dir()
    try:
        return RetrainConfig(
            logs_dir=args.logs,
            registry_dir=registry,
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
            return_model=return_config_from(args, registry),
        )
    except InvalidInputError as error:  # RetrainConfig names the bad field
        raise CommandError(str(error)) from None


def return_config_from(args: argparse.Namespace, registry: Path):
    """The return-time half's configuration, or None with --no-return-model."""
    from training.locations import default_return_registry_dir
    from training.return_fit import ReturnFitConfig
    from training.return_retrain import ReturnRetrainConfig

    if args.no_return_model:
        return None
    return ReturnRetrainConfig(
        registry_dir=args.return_registry or default_return_registry_dir(registry),
        tolerance=args.return_tolerance,
        fit=ReturnFitConfig(
            max_epochs=args.return_max_epochs, seed=args.seed, threads=args.threads or 1
        ),
    )


def check_paths(args: argparse.Namespace, config) -> None:
    """The registries are two writable folders and --logs a folder, before any training."""
    from lpc.errors import CommandError
    from predictor.atomic_files import check_output_folder

    registry, return_model = config.registry_dir, config.return_model
    if return_model is not None and return_model.registry_dir.resolve() == registry.resolve():
        raise CommandError(
            f"--return-registry {return_model.registry_dir} is the access registry: give "
            "the return-time model a folder of its own"
        )
    if not args.logs.is_dir():
        raise CommandError(f"--logs {args.logs} is not a folder")
    # A registry the run could not write (read-only, full) is refused before the training.
    check_output_folder(registry, "--registry")
    if return_model is not None:
        check_output_folder(return_model.registry_dir, "--return-registry")


def check_trace_flags(args: argparse.Namespace) -> None:
    """--horizon and the Ray flags, refused now rather than once the files are picked."""
    from lpc.errors import CommandError

    if not args.horizon > 0:
        raise CommandError(f"--horizon must be > 0 seconds, got {args.horizon}")
    if args.ray_address and not args.ray:
        raise CommandError("--ray-address goes with --ray")
    if args.ray:  # refused now, not as unreadable logs once the files are picked
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise CommandError("--ray needs Ray: pip install 'lpc[ray]' (or run without --ray)")


def trace_log_trainer(args: argparse.Namespace, log):
    """What trains the access-only model when the logs are request traces."""
    from lpc.access.log_retrain import TraceLogTrainer
    from lpc.fleet.fanout import Executor
    from training.access_fit import AccessFitConfig

    return TraceLogTrainer(
        horizon_s=args.horizon,
        split_at=args.split_at,
        min_evaluation_requests=args.min_eval_samples,
        fit=AccessFitConfig(
            hidden_sizes=tuple(args.hidden) if args.hidden else AccessFitConfig.hidden_sizes,
            seed=args.seed,
            threads=args.threads or AccessFitConfig.threads,
        ),
        executor=Executor("ray" if args.ray else "serial", args.ray_address, args.workers),
        log=log,
    )


def print_outcome(outcome, as_json: bool) -> None:
    """The decision as JSON, or one line per model."""
    if as_json:
        print(json.dumps(outcome.to_dict(), indent=2))
        return
    print(
        f"retrain: {outcome.status}: {outcome.reason}"
        + (
            f" (version {outcome.version}, current {outcome.current_version})"
            if outcome.version
            else ""
        )
    )
    if outcome.return_model is not None:
        r = outcome.return_model
        print(
            f"return model: {r.decision}: {r.reason}"
            + (f" (version {r.version}, current {r.current_version})" if r.version else "")
        )
