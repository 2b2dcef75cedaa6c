"""The core install: `pip install lpc` alone, in a clean venv, runs the vLLM plugin with the
shipped access model — and has no torch.

A fresh venv gets the checkout's distribution with no extra (from a copy of its sources, so
the build leaves nothing in the checkout); `import torch` must fail there, and so must the
other extras' libraries. pytest and hypothesis are then added (test tools only) and the
plugin's tests that need no engine run inside it, against the installed package, from a copy
of the tests beside the shipped access model: the plugin built from LPC_* settings with
`models/mooncake-access` predicting in process, the LPC free-block queue over vLLM-like blocks,
releases, evictions, the fail-safe paths (test_core_plugin.py, test_plugin_runtime.py,
test_fail_safe.py, test_vllm_queue.py and the plugin's other unit tests). Real vLLM needs
torch; its tests (`-m vllm`) run in vLLM's venv, where scripts/setup_vllm_plugin.sh also
installs the core alone.

Marked `core_install` (it needs PyPI, or the pip configuration's mirror): `pytest -m
core_install tests/test_core_install.py`, CI's step 1c.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.core_install

REPO = Path(__file__).resolve().parents[1]
# What the distribution is built from (pyproject.toml's packages and its readme).
DIST_SOURCES = ("pyproject.toml", "README.md", "eviction", "predictor", "training", "lpc")
# The plugin's tests that run without an engine; the helpers of tests/integrations come along.
PLUGIN_TESTS = (
    "test_core_plugin.py",
    "test_plugin_runtime.py",
    "test_fail_safe.py",
    "test_return_plugin.py",
    "test_vllm_queue.py",
    "test_config.py",
    "test_predictions.py",
    "test_request_hints.py",
    "test_request_log.py",
    "test_metrics.py",
    "test_safe_defaults.py",
    "test_sglang_strategy.py",
)
# The extras' heavy libraries: none may be importable in the core venv.
NOT_IN_CORE = (
    "torch",
    "transformers",
    "datasets",
    "sentence_transformers",
    "pandas",
    "sklearn",
    "matplotlib",
)
# ... less the one that starts the real prediction server (torch, FastAPI: `lpc[serve]`).
NEEDS_SERVE = "test_plugin_runtime.py::test_the_real_server_predicts_from_the_plugins_items"
PYTEST_INI = """\
[pytest]
addopts = -m "not slow and not vllm and not sglang" -ra -p no:cacheprovider
markers =
    slow: long-running tests
    vllm: tests against real vLLM
    sglang: tests against real SGLang
"""
TIMINGS: dict[str, float] = {}


def _environment() -> dict[str, str]:
    """The caller's environment without anything that would put the checkout on the path."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("LPC_")}


def _run(args: list[str], cwd: Path, timeout_s: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        args,
        cwd=cwd,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _timed(name: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    start = time.perf_counter()
    done = _run(args, cwd)
    TIMINGS[name] = time.perf_counter() - start
    assert done.returncode == 0, (
        f"{' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    return done


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh venv holding the core install, nothing else (yet)."""
    root = tmp_path_factory.mktemp("core-install")
    source = root / "source"
    source.mkdir()
    for name in DIST_SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    venv = root / "venv"
    _timed("venv", [sys.executable, "-m", "venv", str(venv)], root)
    python = venv / "bin" / "python"
    _timed("pip install lpc", [str(python), "-m", "pip", "install", "--quiet", str(source)], root)
    return python


def test_the_core_has_no_torch(core: Path, tmp_path: Path) -> None:
    done = _run([str(core), "-c", "import torch"], tmp_path)
    assert done.returncode != 0 and "No module named 'torch'" in done.stderr, done.stderr
    check = (
        "import importlib.util, json\n"
        f"print(json.dumps([m for m in {NOT_IN_CORE!r} if importlib.util.find_spec(m)]))"
    )
    done = _run([str(core), "-c", check], tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_command_line_names_the_extra_it_needs(core: Path, tmp_path: Path) -> None:
    lpc = core.parent / "lpc"
    assert _run([str(lpc), "--help"], tmp_path).returncode == 0
    done = _run([str(lpc), "train", "--trace", "mooncake", "--out", str(tmp_path / "m")], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "pip install 'lpc[train]'" in done.stderr and "Traceback" not in done.stderr
    done = _run([str(lpc), "serve"], tmp_path)
    assert done.returncode == 2 and "pip install 'lpc[serve]'" in done.stderr, done.stderr


def test_the_vllm_plugin_runs_with_the_access_model_in_the_core(core: Path, tmp_path: Path) -> None:
    import hypothesis

    tools = [f"pytest=={pytest.__version__}", f"hypothesis=={hypothesis.__version__}"]
    _timed("pip install pytest", [str(core), "-m", "pip", "install", "--quiet", *tools], tmp_path)
    # The tests (all of tests/integrations, since some import helpers from others; only
    # PLUGIN_TESTS run), beside the shipped access and return-time models as in the
    # checkout; `lpc` is the installed one.
    work = tmp_path / "work"
    (work / "tests" / "integrations").mkdir(parents=True)
    for name in ("__init__.py", "conftest.py"):
        shutil.copy2(REPO / "tests" / name, work / "tests" / name)
    for path in sorted((REPO / "tests" / "integrations").glob("*.py")):
        shutil.copy2(path, work / "tests" / "integrations" / path.name)
    # The damaged-artifact helper the plugin's refusal tests share with the predictor's
    # (numpy and the standard library only).
    (work / "tests" / "predictor").mkdir()
    for name in ("__init__.py", "broken_artifacts.py"):
        shutil.copy2(REPO / "tests" / "predictor" / name, work / "tests" / "predictor" / name)
    for model in ("mooncake-access", "mooncake-return"):
        shutil.copytree(REPO / "models" / model, work / "models" / model)
    (work / "pytest.ini").write_text(PYTEST_INI)

    where = _run([str(core), "-c", "import lpc as package; print(package.__file__)"], work)
    assert Path(where.stdout.strip()).is_relative_to(core.parent.parent), where.stdout
    tests = [f"tests/integrations/{name}" for name in PLUGIN_TESTS]
    deselect = f"tests/integrations/{NEEDS_SERVE}"
    done = _timed(
        "plugin tests", [str(core), "-m", "pytest", "-q", *tests, "--deselect", deselect], work
    )
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    print(
        f"\ncore install: {summary}; "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in TIMINGS.items())
    )
