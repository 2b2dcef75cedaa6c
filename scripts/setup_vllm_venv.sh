#!/usr/bin/env bash
# Set up ./.vllm-venv with vLLM 0.33.0 for the differential tests against real vLLM; idempotent.
#
# vLLM lives in its OWN venv: its pins (transformers, torch) clash with the project's. Only its
# prefix-cache core (vllm.v1.core) is driven, on the CPU, so vLLM is installed --no-deps with the
# pinned pure-Python packages its imports need (scripts/vllm-0.33.0-requirements.txt) and none of
# its GPU kernels. Torch goes in first, as in bootstrap.sh, so that pip never pulls a CUDA build
# on a CPU machine (override with LPC_TORCH_SPEC).
#
# A no-op when .vllm-venv (a directory, or a symlink to a shared venv) already runs the replay
# driver's imports with vLLM 0.33.0. Exit status 0: ready; 1: vLLM could not be installed, and
# the last line printed says why ("setup_vllm_venv: FAILED: <reason>").
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup_installer.sh
source scripts/setup_installer.sh  # venv_install: uv when it can be had, else pip

vllm_version=0.33.0
python_bin=${PYTHON:-python3}
torch_spec=${LPC_TORCH_SPEC:-torch==2.13.0}
venv=.vllm-venv
requirements=scripts/vllm-${vllm_version}-requirements.txt
log=$(mktemp "${TMPDIR:-/tmp}/lpc-setup-vllm-venv.XXXXXX")

fail() {
    echo "setup_vllm_venv: FAILED: $*" >&2
    exit 1
}

last_error() {  # the most telling line of the log, for the failure message
    local line
    line=$(grep -E "^ERROR" "$log" | head -n 1 || true)  # pip's first error names the cause
    [ -n "$line" ] || line=$(grep -E "Error|error:" "$log" | tail -n 1 || true)  # a traceback's
    [ -n "$line" ] || line=$(grep -v "^\s*$" "$log" | tail -n 1 || true)
    echo "${line:-no output} (full log: $log)"
}

works() {  # does the venv import everything scripts/vllm_replay.py needs, at the pinned version?
    if [ ! -x "$venv/bin/python" ]; then
        echo "$venv/bin/python does not exist" >>"$log"
        return 1
    fi
    "$venv/bin/python" scripts/vllm_replay.py --check >>"$log" 2>&1
}

if works; then
    echo "setup_vllm_venv: $venv already has vLLM $vllm_version ($(readlink -f "$venv"))"
    rm -f "$log"
    exit 0
fi
if [ -L "$venv" ]; then
    fail "$venv is a symlink to $(readlink -f "$venv"), which does not import vLLM" \
        "$vllm_version: $(last_error); fix that venv or remove the link"
fi

command -v "$python_bin" >/dev/null || fail "no $python_bin to create the venv with (set PYTHON)"
if ! "$python_bin" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 15))'; then
    fail "vLLM $vllm_version needs Python 3.11-3.14; $python_bin is $("$python_bin" --version 2>&1 | head -n 1)"
fi
if [ ! -x "$venv/bin/python" ]; then
    echo "setup_vllm_venv: creating $venv with $("$python_bin" --version 2>&1)"
    "$python_bin" -m venv --clear "$venv" >>"$log" 2>&1 || fail "python -m venv: $(last_error)"
fi
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    echo "setup_vllm_venv: installing $torch_spec first"
    venv_install "$venv" "$torch_spec" >>"$log" 2>&1 || fail "pip install $torch_spec: $(last_error)"
fi
echo "setup_vllm_venv: installing vllm==$vllm_version (--no-deps) and $requirements"
venv_install "$venv" --no-deps "vllm==$vllm_version" -r "$requirements" >>"$log" 2>&1 \
    || fail "pip install vllm==$vllm_version: $(last_error)"
works || fail "vLLM $vllm_version installed but the replay's imports fail: $(last_error)"
echo "setup_vllm_venv: $venv is ready with vLLM $vllm_version"
rm -f "$log"
