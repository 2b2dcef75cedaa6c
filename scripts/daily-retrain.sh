#!/usr/bin/env bash
# The daily retraining job, for cron or systemd: `lpc retrain` with settings from the
# environment (defaults in brackets). Exit status is lpc retrain's: 0 promoted, 3 kept the
# current model, 4 no new data, 5 another run holds the lock, 1 failed, 2 bad arguments.
# On trace logs the job also retrains the return-time model into its own registry; the exit
# status stays the access model's decision (the return model's is in the outcome's
# `return_model` section and that registry's history.jsonl).
#
#   LPC_LOGS_DIR            folder of logged conversations or trace files   [required]
#   LPC_REGISTRY_DIR        model registry                                  [models/local/registry]
#   LPC_RETURN_REGISTRY_DIR return-time model registry (trace logs)         [<registry>-return]
#   LPC_RETURN_MODEL        0: do not retrain the return-time model         [1]
#   LPC_CACHE_DIR           caches (embeddings, tokens)                     [.cache/lpc]
#   LPC_NOTIFY_URL          running `lpc serve` to reload after a promotion [none]
#   LPC_WINDOW_DAYS         days of older logs trained on with the new ones [28]
#   LPC_RETRAIN_ARGS        any further `lpc retrain` flags, e.g. "--device cuda"
set -euo pipefail
cd "$(dirname "$0")/.."

: "${LPC_LOGS_DIR:?set LPC_LOGS_DIR to the folder of logged conversations}"
args=(retrain --logs "$LPC_LOGS_DIR" --window-days "${LPC_WINDOW_DAYS:-28}" --no-progress)
if [ -n "${LPC_REGISTRY_DIR:-}" ]; then args+=(--registry "$LPC_REGISTRY_DIR"); fi
if [ -n "${LPC_NOTIFY_URL:-}" ]; then args+=(--notify-url "$LPC_NOTIFY_URL"); fi
# LPC_RETURN_REGISTRY_DIR is read by lpc retrain itself (its --return-registry default)
if [ "${LPC_RETURN_MODEL:-1}" = "0" ]; then args+=(--no-return-model); fi
# shellcheck disable=SC2206  # word splitting of the extra flags is intended
extra=(${LPC_RETRAIN_ARGS:-})
exec nice -n 10 .venv/bin/lpc "${args[@]}" "${extra[@]}"
