"""A bag-of-words reference for the text predictor: TF-IDF on the prompt window + the turn
count, logistic regression, scored on the same held-out half as `lpc train`.

The shipped predictor embeds the same window (the current + 4 previous user prompts) with e5.
If plain word counts score as well, the embedding adds nothing the words do not carry; this
script measures that on the same samples, the same split and the same metrics.

    .venv/bin/python scripts/text_baseline.py --json results/text-baseline.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predictor.features import FeatureConfig
from training.data import split_samples
from training.loaders import load_conversations
from training.metrics import classification_metrics
from training.samples import TurnSample

C_GRID = (0.1, 0.3, 1.0, 3.0)


def frame(samples: list[TurnSample]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "text": ["\n".join(s.window) for s in samples],
            "log_turns": [float(np.log(s.turn_count)) for s in samples],
            "label": [s.label for s in samples],
        }
    )


def pipeline(c: float):
    from sklearn.compose import ColumnTransformer
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    features = ColumnTransformer(
        [
            (
                "words",
                TfidfVectorizer(
                    ngram_range=(1, 2), min_df=3, max_features=200_000, sublinear_tf=True
                ),
                "text",
            ),
            ("turns", "passthrough", ["log_turns"]),
        ]
    )
    model = LogisticRegression(C=c, class_weight="balanced", max_iter=2000)
    return Pipeline([("features", features), ("model", model)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="sharegpt", help="conversations (default: sharegpt)")
    parser.add_argument("--mode", default=None, help="ShareGPT: separate (default) or merge")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    loaded = load_conversations(args.dataset, mode=args.mode)
    split = split_samples(loaded.conversations, FeatureConfig().window_size)
    train, validation, evaluation = (
        frame(s) for s in (split.train, split.validation, split.evaluation)
    )
    from sklearn.metrics import roc_auc_score

    by_c = {}
    for c in C_GRID:  # chosen on validation; the evaluation half is scored once
        fitted = pipeline(c).fit(train, train["label"])
        by_c[c] = roc_auc_score(validation["label"], fitted.predict_proba(validation)[:, 1])
    best_c = max(by_c, key=by_c.get)
    training_half = pd.concat([train, validation], ignore_index=True)
    model = pipeline(best_c).fit(training_half, training_half["label"])
    probabilities = model.predict_proba(evaluation)[:, 1]
    metrics = classification_metrics(evaluation["label"].to_numpy(), probabilities).to_dict()
    result = {
        "dataset": args.dataset,
        "samples": {
            "train": len(train),
            "validation": len(validation),
            "evaluation": len(evaluation),
        },
        "validation_auc_by_c": {str(c): round(v, 4) for c, v in by_c.items()},
        "chosen_c": best_c,
        "evaluation": {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()},
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
