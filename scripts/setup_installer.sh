# Sourced by scripts/bootstrap.sh, setup_vllm_venv.sh, setup_vllm_plugin.sh and
# setup_sglang_venv.sh: `venv_install VENV ARGS...` is `VENV/bin/python -m pip install --quiet
# ARGS...`, done by uv when it can be had. uv downloads, unpacks and compiles in parallel and
# links from its cache: the three venvs of a fresh clone take 288 s instead of pip's 649 s here.
#
# Same packages either way: uv is given pip's own configuration (its find-links, which hold
# the local CPU torch wheel, its index URLs, constraints, certificate and timeout, from
# `pip config list`), resolves across all indexes for the best match as pip does
# (`--index-strategy unsafe-best-match`), compiles the bytecode as pip does, and takes
# scripts/uv-constraints.txt where its resolver would otherwise part from pip's. The venv
# itself is still made by `python -m venv`, with its own pip.
#
# uv is the one on PATH, else one installed once with pip under .cache/uv-installer (ignored
# by git). LPC_INSTALLER=pip keeps to pip; so does any failure to get uv, and pip retries what
# uv fails to install, each said on stderr.

lpc_uv=""
lpc_uv_args=()

_lpc_find_uv() {  # sets lpc_uv to a uv binary, or leaves it empty (pip); $1: a python with pip
    [ "${LPC_INSTALLER:-uv}" != pip ] || return 0
    [ -z "$lpc_uv" ] || return 0
    local python=$1 target=.cache/uv-installer
    if command -v uv >/dev/null 2>&1; then
        lpc_uv=$(command -v uv)
    elif [ -x "$target/bin/uv" ]; then
        lpc_uv=$target/bin/uv
    elif "$python" -m pip install --quiet --disable-pip-version-check --target "$target" \
        "uv>=0.4" >/dev/null 2>&1 && [ -x "$target/bin/uv" ]; then
        lpc_uv=$target/bin/uv
    else
        echo "setup: uv could not be installed; installing with pip" >&2
        return 0
    fi
    # pip's configuration as uv's options; a key's value ranked as pip ranks it.
    local kind name value
    lpc_uv_args=(--index-strategy unsafe-best-match --compile-bytecode
        --constraint scripts/uv-constraints.txt)
    while IFS=$'\t' read -r kind name value; do
        case "$kind" in
            arg) lpc_uv_args+=("$name" "$value") ;;
            flag) lpc_uv_args+=("$name") ;;
            env) export "$name=$value" ;;
        esac
    done < <("$python" - <<'PY'
import ast
import subprocess
import sys

listing = subprocess.run(
    [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
).stdout
found = {}
for line in listing.splitlines():  # `section.key='value'`, sorted by key
    key, _, value = line.partition("=")
    section, _, name = key.rpartition(".")
    if value:
        found[section, name] = str(ast.literal_eval(value))
values = {}  # as pip ranks them: [global], then [install], then PIP_* variables
for rank in ("global", "install", ":env:"):
    values.update({name: value for (section, name), value in found.items() if section == rank})
for name, option in (
    ("find-links", "--find-links"),
    ("index-url", "--index-url"),
    ("extra-index-url", "--extra-index-url"),
    ("constraint", "--constraint"),
    ("trusted-host", "--allow-insecure-host"),
):
    for value in values.get(name, "").split():
        print(f"arg\t{option}\t{value}")
if values.get("no-index", "").lower() in ("1", "true", "yes", "on"):
    print("flag\t--no-index\t")
if values.get("cert"):
    print(f"env\tSSL_CERT_FILE\t{values['cert']}")
timeout = values.get("timeout") or values.get("default-timeout")
if timeout:
    print(f"env\tUV_HTTP_TIMEOUT\t{timeout}")
PY
    )
    return 0
}

venv_install() {  # venv_install VENV ARGS...: pip install --quiet ARGS into VENV
    local venv=$1
    shift
    _lpc_find_uv "$venv/bin/python"
    if [ -n "$lpc_uv" ]; then
        "$lpc_uv" pip install --quiet --python "$venv/bin/python" "${lpc_uv_args[@]}" "$@" \
            && return 0
        echo "setup: uv could not install $*; trying pip" >&2
    fi
    "$venv/bin/python" -m pip install --quiet "$@"
}
