"""Train predictor variants on one data set and compare them on held-out data.

Each variant is one `lpc train` configuration (the paper's recipe, then one departure at a
time); all share the embedding cache, so after the first embedding pass a variant costs one
MLP fit. Prints a table and writes JSON; `--save-dir` also keeps each variant's artifact (for
`lpc ab --model`). Choose variants on the validation numbers; the evaluation half is reported
once per variant and never used to pick anything.

    .venv/bin/python scripts/studies/predictor_experiments.py --variants paper,context,finish \
        --json results/predictor-variants.json --save-dir results/variants
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lpc.replay.learned_source import ServingTokenCounter
from predictor.access_features import needs_token_counts
from predictor.artifact import save_artifact
from predictor.embedders import load_embedder
from predictor.features import FeatureConfig
from training.embedding_cache import EmbeddingCache, EmbedOptions
from training.fit import FitConfig
from training.loaders import load_conversations
from training.locations import default_embedding_cache_dir
from training.pipeline import TrainConfig, train_predictor

PAPER = TrainConfig()
VARIANTS: dict[str, TrainConfig] = {
    # the paper's recipe: e5 embedding of N=4+1 prompts (even budget) + log turn count
    "paper": PAPER,
    "paper-raw-turns": replace(PAPER, feature_config=FeatureConfig(turn_count_encoding="raw")),
    "paper-no-weighting": replace(PAPER, fit=FitConfig(class_weighting="none")),
    # the paper leaves batch size and stopping open: smaller batches, more patience
    "paper-b64": replace(PAPER, fit=FitConfig(batch_size=64, patience=10)),
    "paper-b1024": replace(PAPER, fit=FitConfig(batch_size=1024, patience=10)),
    # issue-4 stretch: each prompt embedded alone, the window = the mean of its prompts' vectors
    "prompt-mean": replace(PAPER, feature_config=FeatureConfig(window_encoding="prompt_mean")),
    "redistribute": replace(PAPER, feature_config=FeatureConfig(share_policy="redistribute")),
    # the text model's registered scalars (predictor.access_features), one group at a time,
    # then together
    "context": replace(PAPER, finish_features=("log_context_chars",)),
    "reply": replace(PAPER, finish_features=("log_reply_chars", "reply_asks")),
    "prompt-length": replace(PAPER, finish_features=("log_prompt_chars",)),
    "finish": replace(
        PAPER,
        finish_features=("log_context_chars", "log_reply_chars", "reply_asks", "log_prompt_chars"),
    ),
    # the request's size in serving tokens (Qwen ChatML), what the engine counts anyway
    "tokens": replace(PAPER, finish_features=("log_request_tokens",)),
    # the prompt's size alone: known when the engine first schedules the request
    "prompt-tokens": replace(PAPER, finish_features=("log_prompt_tokens",)),
    "prompt-tokens-chars": replace(
        PAPER, finish_features=("log_prompt_tokens", "log_prompt_chars")
    ),
    "prompt-tokens-wide": replace(
        PAPER, hidden_sizes=(256, 256, 256), dropout=0.1, finish_features=("log_prompt_tokens",)
    ),
    "prompt-tokens-raw-turns": replace(
        PAPER,
        feature_config=FeatureConfig(turn_count_encoding="raw"),
        finish_features=("log_prompt_tokens",),
    ),
    "tokens-reply": replace(
        PAPER, finish_features=("log_request_tokens", "log_output_tokens", "reply_asks")
    ),
    "all-finish": replace(
        PAPER,
        finish_features=(
            "log_request_tokens",
            "log_output_tokens",
            "log_context_chars",
            "log_reply_chars",
            "reply_asks",
            "log_prompt_chars",
        ),
    ),
    "tokens-reply-wide": replace(
        PAPER,
        hidden_sizes=(256, 256, 256),
        dropout=0.1,
        finish_features=("log_request_tokens", "log_output_tokens", "reply_asks"),
    ),
    "tokens-reply-long": replace(
        PAPER,
        fit=FitConfig(patience=10, max_epochs=40),
        finish_features=("log_request_tokens", "log_output_tokens", "reply_asks"),
    ),
    "finish-wide": replace(
        PAPER,
        hidden_sizes=(256, 256, 256),
        dropout=0.1,
        finish_features=("log_context_chars", "log_reply_chars", "reply_asks", "log_prompt_chars"),
    ),
}


def main() -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dataset", default="sharegpt")
    parser.add_argument("--mode", default=None)
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="only the first N records of the data set (quick comparisons)",
    )
    parser.add_argument(
        "--variants",
        default="paper,context,reply,prompt-length,finish",
        help=f"comma-separated, from: {', '.join(VARIANTS)}",
    )
    parser.add_argument("--seeds", default="0", help="comma-separated seeds per variant")
    parser.add_argument("--embedder", default="e5-small-q4")
    parser.add_argument("--json", type=Path, help="write all metrics here")
    parser.add_argument("--save-dir", type=Path, help="save each variant's artifact here")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--no-eval",
        action="store_true",
        help="validation metrics only (no evaluation half to embed)",
    )
    args = parser.parse_args()

    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    options = {} if args.mode is None else {"mode": args.mode}
    conversations = load_conversations(args.dataset, limit=args.limit, **options).conversations
    embedder = load_embedder(args.embedder)
    cache = EmbeddingCache.open(
        default_embedding_cache_dir(), embedder.embedder_id, embedder.dim, embedder=embedder
    )
    embed = EmbedOptions(progress=not args.no_progress)
    counter = ServingTokenCounter(progress=not args.no_progress)
    results = []
    for name in names:
        for seed in seeds:
            config = replace(
                VARIANTS[name],
                embedder_spec=args.embedder,
                fit=replace(VARIANTS[name].fit, seed=seed),
            )
            started = time.perf_counter()
            outcome = train_predictor(
                conversations,
                config,
                embedder,
                cache,
                embed,
                data_description={"dataset": args.dataset, "mode": args.mode, "variant": name},
                evaluate=not args.no_eval,
                token_counter=counter if needs_token_counts(config.finish_features) else None,
                log=lambda m: print(f"  {m}", file=sys.stderr),
            )
            seconds = time.perf_counter() - started
            metrics = outcome.metrics
            results.append(
                {
                    "variant": name,
                    "seed": seed,
                    "seconds": round(seconds, 1),
                    "validation": metrics["validation"],
                    "evaluation": metrics.get("evaluation"),
                    "turns_ablation": metrics.get("turns_ablation"),
                    "fit": metrics["fit"],
                    "config": config.to_dict(),
                }
            )
            if args.save_dir is not None:
                folder = args.save_dir / (name if len(seeds) == 1 else f"{name}-s{seed}")
                save_artifact(
                    folder, outcome.artifact.model, outcome.artifact.metadata, overwrite=True
                )
            v = metrics["validation"]
            line = (
                f"{name:20} seed {seed}: val AUC {v['roc_auc']:.4f} MCC {v['mcc']:.4f} "
                f"F1 {v['macro_f1']:.4f}"
            )
            if "evaluation" in metrics:
                e = metrics["evaluation"]
                line += (
                    f" | eval MCC {e['mcc']:.4f} F1 {e['macro_f1']:.4f} "
                    f"AUC {e['roc_auc']:.4f} Brier {e['brier']:.4f}"
                )
            print(f"{line} ({seconds:.0f} s)", flush=True)
    if results and results[0]["turns_ablation"]:
        for kind, m in results[0]["turns_ablation"].items():
            print(
                f"{'turns-only ' + kind:20}        : eval MCC {m['mcc']:.4f} "
                f"F1 {m['macro_f1']:.4f} AUC {m['roc_auc']:.4f} Brier {m['brier']:.4f}"
            )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
