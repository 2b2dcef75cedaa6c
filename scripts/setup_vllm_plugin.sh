#!/usr/bin/env bash
# Make ./.vllm-venv ready for the LPC plugin's tests: vLLM 0.33.0 (scripts/setup_vllm_venv.sh)
# plus what the plugin itself needs there; idempotent.
#
# The plugin imports only the standard library, `eviction` and `lpc.integrations`, and, when a
# predictor URL is configured, the project's predictor client (`predictor.client`), which needs
# httpx; vLLM 0.33.0 does not depend on httpx (it has numpy and pydantic, the client's other
# imports). So httpx and httpcore are added, pinned and --no-deps (their own dependencies,
# anyio, h11, certifi and idna, are vLLM's too).
#
# Exit status 0: ready; 1: not possible, the last line saying why
# ("setup_vllm_plugin: FAILED: <reason>", or setup_vllm_venv's own line).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup_vllm_venv.sh
venv=.vllm-venv
if "$venv/bin/python" -c "import httpx, httpcore" >/dev/null 2>&1; then
    echo "setup_vllm_plugin: $venv already has httpx"
    exit 0
fi
echo "setup_vllm_plugin: adding httpx to $venv (the predictor client's HTTP library)"
if ! "$venv/bin/python" -m pip install --quiet --no-deps httpx==0.28.1 httpcore==1.0.9; then
    echo "setup_vllm_plugin: FAILED: pip install httpx==0.28.1 httpcore==1.0.9 into $venv" >&2
    exit 1
fi
"$venv/bin/python" -c "import httpx, httpcore, anyio, h11, certifi, idna" \
    || { echo "setup_vllm_plugin: FAILED: httpx installed but does not import" >&2; exit 1; }
echo "setup_vllm_plugin: $venv is ready for the LPC plugin"
