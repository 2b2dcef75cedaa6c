#!/usr/bin/env bash
# Set up ./.sglang-venv with SGLang 0.5.23 for the LPC strategy's tests; idempotent.
#
# SGLang lives in its OWN venv (its pins clash with the project's). Only what the LPC
# strategy's tests import is installed: sglang --no-deps plus the pinned packages of
# scripts/sglang-0.5.23-requirements.txt, enough for its plugin loader, eviction-policy
# registry and argument parser, and for its real RadixCache and UnifiedRadixCache on CPU
# (with a real TokenToKVPoolAllocator and MHATokenToKVPool). SGLang's serving runtime (CUDA
# kernels, flashinfer, ...) is not installed. Torch goes in first, pinned (override with
# LPC_TORCH_SPEC), so pip never pulls a CUDA build on a CPU machine.
#
# torchvision on CPU: the radix caches' import chain reaches SGLang's model configs, which
# import torchvision (configs/nano_nemotron_vl.py -> multimodal/internvl_utils.py). The only
# torchvision for torch 2.13.0 on PyPI (0.28.0) is a CUDA build, and its import fails in
# torchvision._meta_registrations ("operator torchvision::nms does not exist"), which
# registers meta kernels for compiled ops a CPU torch cannot load. The script writes a
# one-line .pth file into the venv's site-packages that registers an empty module under
# that name before anything imports torchvision, so every process of this venv imports the
# real torchvision with its compiled ops (nms, roi_align, ...) off. Neither SGLang's code nor
# torchvision's files are changed, and nothing the caches run uses those ops.
#
# Exit status 0: ready; 1: SGLang could not be installed, and the last line printed says why
# ("setup_sglang_venv: FAILED: <reason>").
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup_installer.sh
source scripts/setup_installer.sh  # venv_install: uv when it can be had, else pip

sglang_version=0.5.23
python_bin=${PYTHON:-python3}
torch_spec=${LPC_TORCH_SPEC:-torch==2.13.0}
venv=.sglang-venv
requirements=scripts/sglang-${sglang_version}-requirements.txt
log=$(mktemp "${TMPDIR:-/tmp}/lpc-setup-sglang-venv.XXXXXX")

fail() {
    echo "setup_sglang_venv: FAILED: $*" >&2
    exit 1
}

last_error() {  # the most telling line of the log, for the failure message
    local line
    line=$(grep -E "^ERROR" "$log" | head -n 1 || true)
    [ -n "$line" ] || line=$(grep -E "Error|error:" "$log" | tail -n 1 || true)
    [ -n "$line" ] || line=$(grep -v "^\s*$" "$log" | tail -n 1 || true)
    echo "${line:-no output} (full log: $log)"
}

works() {  # does the venv import what the LPC strategy's tests need, at the pinned version?
    if [ ! -x "$venv/bin/python" ]; then
        echo "$venv/bin/python does not exist" >>"$log"
        return 1
    fi
    "$venv/bin/python" - >>"$log" 2>&1 <<PY
import importlib, sys, warnings
warnings.filterwarnings("ignore")
import sglang
assert sglang.__version__ == "$sglang_version", sglang.__version__
for name in ("sglang.srt.plugins", "sglang.srt.mem_cache.utils", "sglang.srt.arg_groups.choices",
             "sglang.srt.mem_cache.evict_policy", "sglang.srt.server_args", "torchvision",
             "sglang.srt.mem_cache.allocator", "sglang.srt.mem_cache.memory_pool",
             "sglang.srt.mem_cache.radix_cache", "sglang.srt.mem_cache.unified_radix_cache"):
    try:
        importlib.import_module(name)
    except Exception as error:
        print(f"ERROR: import {name} fails: {type(error).__name__}: {error}")
        sys.exit(1)
PY
}

write_torchvision_shim() {  # see the header: the real torchvision, its compiled ops off
    local site
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
        || fail "cannot find $venv's site-packages"
    echo "import sys, types; sys.modules.setdefault('torchvision._meta_registrations', types.ModuleType('torchvision._meta_registrations'))" \
        >"$site/lpc_torchvision_cpu_shim.pth" || fail "cannot write $site/lpc_torchvision_cpu_shim.pth"
}

if works; then
    echo "setup_sglang_venv: $venv already has SGLang $sglang_version ($(readlink -f "$venv"))"
    rm -f "$log"
    exit 0
fi
if [ -L "$venv" ]; then
    fail "$venv is a symlink to $(readlink -f "$venv"), which does not import SGLang" \
        "$sglang_version: $(last_error); fix that venv or remove the link"
fi
command -v "$python_bin" >/dev/null || fail "no $python_bin to create the venv with (set PYTHON)"
if ! "$python_bin" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] < (3, 14))'; then
    fail "SGLang $sglang_version wheels need Python 3.10-3.13; $python_bin is $("$python_bin" --version 2>&1)"
fi
if [ ! -x "$venv/bin/python" ]; then
    echo "setup_sglang_venv: creating $venv with $("$python_bin" --version 2>&1)"
    "$python_bin" -m venv --clear "$venv" >>"$log" 2>&1 || fail "python -m venv: $(last_error)"
fi
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    echo "setup_sglang_venv: installing $torch_spec first"
    venv_install "$venv" "$torch_spec" >>"$log" 2>&1 || fail "pip install $torch_spec: $(last_error)"
fi
echo "setup_sglang_venv: installing sglang==$sglang_version (--no-deps) and $requirements"
venv_install "$venv" --no-deps "sglang==$sglang_version" -r "$requirements" >>"$log" 2>&1 \
    || fail "pip install sglang==$sglang_version: $(last_error)"
write_torchvision_shim
works || fail "SGLang $sglang_version installed but its imports fail: $(last_error)"
echo "setup_sglang_venv: $venv is ready with SGLang $sglang_version"
rm -f "$log"
