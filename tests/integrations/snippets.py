"""Running a short snippet in an engine's own venv, with the repository (and more) importable.

Each engine lives in its own venv (their pins clash with ours): vLLM's python is
`LPC_VLLM_PYTHON` or `.vllm-venv/bin/python`, SGLang's `LPC_SGLANG_PYTHON` or
`.sglang-venv/bin/python` (scripts/setup_sglang_venv.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from lpc.drivers.sglang_radix import sglang_python_path
from lpc.drivers.vllm_driver import REPO_ROOT

__all__ = [
    "WATCH_LPC",
    "WATCH_WARNINGS",
    "SnippetFailed",
    "entry_point_site",
    "run_snippet",
    "run_vllm_trace_ab",
    "sglang_python_path",
]


# Snippet code that records every warning on the plugin's logger (`warnings`) in the
# snippet's vLLM process (needs `logging` imported).
WATCH_WARNINGS = """warnings = []
class Warnings(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(record.getMessage())
logging.getLogger("vllm.plugins.lpc").addHandler(Warnings())
"""

# Snippet code that records what LPC does in the snippet's vLLM process: every call LPC's code
# makes to `sys._getframe` (`stack_reads`: the plugin must read no call stack), and its
# warnings (`WATCH_WARNINGS`).
WATCH_LPC = (
    """stack_reads = []
read_stack = sys._getframe
def watched(depth=0):
    caller = read_stack(1).f_globals.get("__name__", "")
    if caller.startswith(("lpc", "eviction")):
        stack_reads.append(caller)
    return read_stack(depth + 1)
sys._getframe = watched
"""
    + WATCH_WARNINGS
)


class SnippetFailed(RuntimeError):
    """The snippet exited with an error; the message ends with its stderr."""


def run_snippet(
    python: Path,
    code: str,
    env: Mapping[str, str] | None = None,
    extra_path: Path | None = None,
    timeout_s: float = 600,
) -> str:
    """The snippet's stdout. The caller's LPC_*, VLLM_* and SGLANG_* variables are not passed
    on, so a developer's shell cannot change what a test checks."""
    paths = [str(REPO_ROOT), *([str(extra_path)] if extra_path is not None else [])]
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("LPC_", "VLLM_", "SGLANG_"))
    }
    environment["PYTHONPATH"] = os.pathsep.join(paths)
    environment.update(env or {})
    done = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
        env=environment,
        check=False,
    )
    if done.returncode != 0:
        raise SnippetFailed(f"snippet failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def entry_point_site(tmp_path: Path, group: str) -> Path:
    """A throwaway distribution declaring our pyproject's `lpc` entry point of `group`, so the
    engine's own plugin loader finds it without installing anything into its venv."""
    import tomllib

    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    value = pyproject["project"]["entry-points"][group]["lpc"]
    dist = tmp_path / "lpc_entry_point_check-0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: lpc-entry-point-check\nVersion: 0.0\n"
    )
    with (dist / "entry_points.txt").open("a") as handle:
        handle.write(f"[{group}]\nlpc = {value}\n")
    return tmp_path


def run_vllm_trace_ab(
    trace: Path, vllm_python: Path, cache_tokens: int, *extra: str, timeout_s: float = 1800
) -> dict:
    """`scripts/vllm_trace_ab.py --json` on `trace`: our replay beside vLLM + plugin, parsed."""
    done = subprocess.run(
        [
            sys.executable,
            "scripts/vllm_trace_ab.py",
            str(trace),
            "--cache-tokens",
            str(cache_tokens),
            "--json",
            "--vllm-python",
            str(vllm_python),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout)
