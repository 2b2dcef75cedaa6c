#!/usr/bin/env bash
# Make ./.vllm-venv ready for the LPC plugin's tests: vLLM 0.33.0 (scripts/setup_vllm_venv.sh)
# plus the LPC core installed into it, as on a serving host; idempotent.
#
# The core is `pip install lpc` with no extra: the evictors, the block manager, the engine
# integrations and the numpy access predictor, with numpy, xxhash, safetensors, httpx (the
# predictor client) and prometheus-client; no torch of ours, so nothing of vLLM's own pins
# moves. It goes in editable from this checkout, so the plugin vLLM loads from its entry point
# is the checkout's code, and the plugin tests in vLLM's venv prove that the core's
# dependencies are all the plugin needs there (the extras are never installed into it).
#
# Exit status 0: ready; 1: not possible, the last line saying why
# ("setup_vllm_plugin: FAILED: <reason>", or setup_vllm_venv's own line).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup_vllm_venv.sh
# shellcheck source=scripts/setup_installer.sh
source scripts/setup_installer.sh  # venv_install: uv when it can be had, else pip
venv=.vllm-venv

# Installed, from this checkout, with the core dependencies pyproject.toml lists today?
core_installed() {
    # -I: not the checkout's own lpc.egg-info (the current directory) but the venv's install.
    "$venv/bin/python" -I - <<'EOF' >/dev/null 2>&1
import importlib.metadata as metadata
import json
import sys
import tomllib
from pathlib import Path

core = tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"]
dist = metadata.distribution("lpc")
url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
requires = [r for r in dist.requires or [] if "extra ==" not in r]
here = Path.cwd().resolve().as_uri()
sys.exit(not (url == here and sorted(requires) == sorted(core)))
EOF
}

if core_installed; then
    echo "setup_vllm_plugin: $venv already has the LPC core from this checkout"
    exit 0
fi
echo "setup_vllm_plugin: installing the LPC core (pip install -e ., no extras) into $venv"
log=$(mktemp "${TMPDIR:-/tmp}/lpc-setup-vllm-plugin.XXXXXX")
if ! venv_install "$venv" -e . >"$log" 2>&1; then
    line=$(grep -E "^ERROR" "$log" | head -n 1 || true)
    echo "setup_vllm_plugin: FAILED: pip install -e . into $venv: ${line:-see $log}" >&2
    exit 1
fi
rm -f "$log"
"$venv/bin/python" -c "import lpc.integrations.vllm_plugin, predictor.access_predictor, httpx" \
    || { echo "setup_vllm_plugin: FAILED: the core installed but the plugin does not import" >&2; exit 1; }
core_installed || { echo "setup_vllm_plugin: FAILED: the core's install check fails after installing it" >&2; exit 1; }
echo "setup_vllm_plugin: $venv is ready for the LPC plugin"
