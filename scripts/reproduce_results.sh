#!/usr/bin/env bash
# Reproduce docs/results.md: predictor variants on the bundled ShareGPT (separate and merge
# modes), the shipped model, the headline A/B with the λ_chat sweep, and the decay scale
# fixed vs estimated.
#
# The first run embeds every ShareGPT user-turn window with multilingual-e5-small: about an
# hour on 2 free CPU cores for `separate` (61,209 windows), plus ~21,000 for `merge`
# (resumable: rerun after an interruption), minutes on a GPU (`LPC_EMBED_ARGS="--device cuda"`).
# Everything after that reads the embedding cache. Outputs go to results/ (git-ignored); the
# shipped model to models/sharegpt-e5-small-q4.
set -euo pipefail
cd "$(dirname "$0")/.."
lpc=.venv/bin/lpc
python=.venv/bin/python
out=${LPC_RESULTS_DIR:-results}
mkdir -p "$out"
# shellcheck disable=SC2206  # word splitting of the extra flags is intended
embed=(${LPC_EMBED_ARGS:-})

# 1. Fill the embedding cache (both halves, both modes), then train the variants from it.
$lpc train --embed-only "${embed[@]}"
$lpc train --mode merge --embed-only "${embed[@]}"
$python scripts/studies/predictor_experiments.py --variants paper,paper-b64,paper-b1024,paper-raw-turns \
    --seeds 0,1,2 --json "$out/predictor-paper-variants.json"
$python scripts/studies/predictor_experiments.py \
    --variants prompt-mean,context,prompt-tokens,prompt-tokens-chars,prompt-tokens-wide,prompt-tokens-raw-turns,tokens,tokens-reply,all-finish \
    --json "$out/predictor-variants.json" --save-dir "$out/variants"
$python scripts/studies/predictor_experiments.py --mode merge --variants paper,prompt-tokens \
    --json "$out/variants-merge.json" --save-dir "$out/variants-merge"

# 2. The shipped model: the paper's recipe (docs/results.md §1-3 say why), with its metrics.
$lpc train --out models/sharegpt-e5-small-q4 --overwrite --json > "$out/shipped-model.json"

# 3. Hit ratio of each variant on the paper's workload (the decay scale fixed at 0.01).
for variant in context prompt-tokens tokens tokens-reply all-finish; do
    $lpc ab --model "$out/variants/$variant" --policies lru,lpc,oracle --scale 0.01 \
        --out "$out/ab-variant-$variant" --json > "$out/ab-variant-$variant.json"
done
$lpc ab --model "$out/variants/prompt-mean" --policies lru,lpc,oracle \
    --out "$out/ab-variant-prompt-mean" --json > "$out/ab-variant-prompt-mean.json"
# ... and on whole conversations (merge mode).
for variant in paper prompt-tokens; do
    $lpc ab --mode merge --model "$out/variants-merge/$variant" \
        --policies lru,lpc-turns,lpc,oracle,belady --out "$out/ab-merge-$variant" \
        --json > "$out/ab-merge-$variant.json"
done
$lpc ab --mode merge --policies lru,lpc --out "$out/ab-merge-separate-paper" \
    --json > "$out/ab-merge-separate-paper.json"
$lpc ab --mode merge --model "$out/variants/prompt-tokens" --policies lru,lpc \
    --out "$out/ab-merge-separate-prompt-tokens" --json > "$out/ab-merge-separate-prompt-tokens.json"

# 4. The headline: every policy, 60K-160K tokens, with the λ_chat sweep; the decay scale
#    estimated (the default) and fixed at 0.01, at each λ_chat.
$lpc ab --think-time-sweep 50,100,200 --out "$out/ab-headline-auto" --json > "$out/ab-headline-auto.json"
$lpc ab --think-time-sweep 50,100,200 --scale 0.01 --out "$out/ab-headline" \
    --json > "$out/ab-headline.json"
for think in 50 200; do
    for scale in 0.01 auto; do
        $lpc ab --think-time "$think" --scale "$scale" --policies lru,lpc-turns,lpc,oracle \
            --out "$out/ab-think$think-scale$scale" --json > "$out/ab-think$think-scale$scale.json"
    done
done

# 5. Real traffic (docs/results.md, "Real traffic"): LRU's eviction ages, the access model on
#    the Mooncake trace (each split with a model trained on its own training part), the
#    synthetic trace, and the access predictor's speed.
$python scripts/studies/lru_eviction_age.py --json > "$out/lru-eviction-age.json"
$lpc train --trace mooncake --out "$out/access-0.5" --overwrite --json > "$out/train-access-0.5.json"
$lpc ab --trace mooncake --model "$out/access-0.5" --out "$out/ab-trace-0.5" --json \
    > "$out/ab-trace-0.5.json"
for split in 0.33 0.67; do
    $lpc train --trace mooncake --split-at "$split" --out "$out/access-$split" --overwrite \
        --json > "$out/train-access-$split.json"
    $lpc ab --trace mooncake --split-at "$split" --model "$out/access-$split" \
        --out "$out/ab-trace-$split" --json > "$out/ab-trace-$split.json"
done
$lpc ab --trace mooncake-synthetic --out "$out/ab-synthetic" --json > "$out/ab-synthetic.json"
$lpc bench access --train-trace mooncake --json > "$out/bench-access.json"
echo "results in $out/"
