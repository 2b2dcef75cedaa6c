#!/usr/bin/env bash
# Reproduce docs/results.md: predictor variants on the bundled ShareGPT, the shipped model, the
# headline A/B, the λ_chat sweep with the fixed and the automatic decay scale.
#
# The first run embeds all 61,210 ShareGPT user turns with multilingual-e5-small: about an hour
# on 2 free CPU cores (resumable: rerun after an interruption), seconds on a GPU
# (`LPC_EMBED_ARGS="--device cuda"`). Everything after that reads the embedding cache.
# Outputs go to results/ (git-ignored); the shipped model to models/sharegpt-e5-small-q4.
set -euo pipefail
cd "$(dirname "$0")/.."
lpc=.venv/bin/lpc
python=.venv/bin/python
out=${LPC_RESULTS_DIR:-results}
mkdir -p "$out"
# shellcheck disable=SC2206  # word splitting of the extra flags is intended
embed=(${LPC_EMBED_ARGS:-})

# 1. Fill the embedding cache (both halves), then train every variant from it.
$lpc train --embed-only "${embed[@]}"
$python scripts/predictor_experiments.py \
    --variants paper,context,tokens,tokens-reply,all-finish \
    --json "$out/predictor-variants.json" --save-dir "$out/variants"

# 2. The shipped model (the configuration docs/results.md chose), with its metrics.
$lpc train --finish-features log_request_tokens,log_output_tokens,reply_asks \
    --out models/sharegpt-e5-small-q4 --overwrite --json > "$out/shipped-model.json"

# 3. Hit ratio of each variant on the paper's workload.
for variant in paper context tokens tokens-reply all-finish; do
    $lpc ab --model "$out/variants/$variant" --policies lru,lpc,oracle \
        --out "$out/ab-variant-$variant" --json > "$out/ab-variant-$variant.json"
done

# 4. The headline: every policy, 60K-160K tokens, with the λ_chat sweep; the decay scale
#    fixed at 1e-2 and automatic.
$lpc ab --think-time-sweep 50,100,200 --scale 0.01 --out "$out/ab-headline" \
    --json > "$out/ab-headline.json"
$lpc ab --think-time-sweep 50,100,200 --scale auto --out "$out/ab-headline-auto" \
    --json > "$out/ab-headline-auto.json"
echo "results in $out/"
