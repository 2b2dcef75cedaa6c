"""The vLLM plugin as an operator deploys it with the shipped access model, on the core install.

Settings come from the LPC_* environment (`load_config`, as the scheduler class reads them
without an `lpc` table), the runtime is `build_runtime`'s (the access model
`models/mooncake-access` loaded in process, the default `lpc-pooled` evictor on the model's
horizon), and the scheduler class's calls (`scheduler_lpc`) drive the LPC free-block queue in
the stand-in engine of test_fail_safe.py: allocations, prefix hits,
releases whose p the model computes at the release, evictions. Nothing here needs torch or
vLLM, so tests/test_core_install.py runs this file inside a clean venv holding `pip install lpc`
alone; the default suite runs it too.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eviction import PooledLPCEvictor
from lpc.integrations import vllm_plugin
from lpc.integrations.config import load_config
from predictor.access_features import ConversationState, RequestState
from predictor.access_predictor import AccessPredictor
from tests.integrations import test_fail_safe
from tests.integrations.access_models import SHIPPED
from tests.integrations.test_fail_safe import Run, StepClock, run_engine

OPTIONAL = ("torch", "transformers", "datasets", "sentence_transformers", "pandas")


def deployed_runtime(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, str]
) -> vllm_plugin.PluginRuntime:
    """`build_runtime` on the configuration the scheduler class reads from these LPC_* settings
    (and no others), on a step clock."""
    for name in [n for n in os.environ if n.startswith("LPC_")]:
        monkeypatch.delenv(name)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    return vllm_plugin.build_runtime(load_config(), clock=StepClock())


def deployed_run(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, str], steps: int = 600
) -> Run:
    """The stand-in engine's workload on that runtime; each request arrives at the step clock's
    time (vLLM's `Request.arrival_time`) and its prompt grows with its index, so the model
    sees real think times and sizes."""
    runtime = deployed_runtime(monkeypatch, settings)
    clock = runtime.queues.clock

    class TimedRequest(test_fail_safe.Request):
        def __post_init__(self) -> None:
            super().__post_init__()
            self.arrival_time = clock.now
            self.prompt_token_ids = list(range(2000 + 997 * (self.index % 23)))

    monkeypatch.setattr(test_fail_safe, "Request", TimedRequest)
    return run_engine(runtime, lambda i, c: {"lpc_conversation_id": c}, monkeypatch, steps=steps)


def test_the_plugin_evicts_by_the_shipped_access_model(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[RequestState, ConversationState, float]] = []
    original = AccessPredictor.predict_one

    def recorded(self: AccessPredictor, request: Any, conversation: Any) -> float:
        p = original(self, request, conversation)
        seen.append((request, conversation, p))
        return p

    monkeypatch.setattr(AccessPredictor, "predict_one", recorded)
    run = deployed_run(monkeypatch, {"LPC_ACCESS_MODEL": str(SHIPPED)})
    access = run.runtime.access
    assert access is not None and Path(access.pointer[0]).resolve() == SHIPPED.resolve()
    queues = run.runtime.queues
    assert isinstance(queues.new_evictor(8), PooledLPCEvictor), "the default: lpc-pooled"
    assert queues.evictor_horizon_s == access.horizon_s == 180.0, "the model's own horizon"

    s = run.stats
    assert s["releases"] > 100 and run.hits > 50 and s["evictions"] > 20
    assert s["predictions_in_process"] == s["releases"], "every release predicted in process"
    assert s["fallbacks_used"] == s["plugin_errors"] == s["invalid_probabilities"] == 0
    assert s["access_prediction_errors"] == 0

    # The p the evictor got are the shipped model's, varied, and in (0, 1).
    fresh = AccessPredictor.load(SHIPPED)
    releases = seen[-s["releases"] :]  # the load-time probe request comes first
    for request, conversation, p in releases:
        assert p == original(fresh, request, conversation)
    probabilities = [p for _, _, p in releases]
    assert all(0 <= p <= 1 and math.isfinite(p) for p in probabilities)
    assert len(set(probabilities)) > 100 and max(probabilities) - min(probabilities) > 0.5


def test_the_models_probabilities_decide_the_evictions(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `lpc` (no trust gate), the model's p give another eviction order than the
    fallback p alone on the same workload."""
    settings = {"LPC_EVICTOR": "lpc", "LPC_FALLBACK_P": "0.3"}
    # 300 steps (150 releases) are enough to tell two eviction orders apart
    run = deployed_run(monkeypatch, {**settings, "LPC_ACCESS_MODEL": str(SHIPPED)}, steps=300)
    config = run.runtime.config
    assert config.evictor == "lpc" and config.fallback_probability == 0.3
    assert run.stats["predictions_in_process"] == run.stats["releases"] > 100
    fallback_only = deployed_run(monkeypatch, settings, steps=300)
    assert fallback_only.stats["fallbacks_used"] == fallback_only.stats["releases"]
    assert fallback_only.orders != run.orders


def test_the_plugin_path_imports_no_optional_dependency() -> None:
    """What the plugin loads in an engine's process: none of the extras' heavy libraries
    (in the default suite they are installed, so this checks what was imported, not what
    exists; tests/test_core_install.py checks they are absent there)."""
    code = (
        "import sys\n"
        "from lpc.integrations import vllm_plugin, sglang_strategy, metrics\n"
        "from lpc.integrations.config import load_config\n"
        f"import os; os.environ['LPC_ACCESS_MODEL'] = {str(SHIPPED)!r}\n"
        "vllm_plugin.build_runtime(load_config())\n"
        "import predictor.client\n"
        f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))\n"
    )
    # The folder holding `tests`: the checkout, or the core-install test's copy of the tests
    # (where `lpc` is the installed one).
    tests_root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(tests_root)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
