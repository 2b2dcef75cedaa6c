"""`lpc vllm-ab` on stock vLLM 0.33.0 serves the plugin's policies as a deployment runs them:
through vLLM's own `--scheduler-cls` (`LPCScheduler`, its settings in `--additional-config`,
no LPC_* variable in the engine's environment), `lpc-const` as stock vLLM at every step. The
scheduler sample of test_vllm_scheduler_sample.py (76 requests), three engines. The class
against a second path into vLLM, step for step: test_vllm_seam.py.

Marked `vllm` (CI step 3); needs vLLM's venv (`vllm_python`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lpc.drivers.release_plan import PluginSettings
from lpc.drivers.scheduler_ab import compare
from lpc.drivers.vllm_scheduler import SCHEDULER_CLASS
from tests.integrations.report import REPORT
from tests.integrations.test_vllm_scheduler import rows_of, sharegpt_like
from tests.integrations.test_vllm_seam import ENGINE

pytestmark = pytest.mark.vllm


def test_the_command_serves_the_plugin_through_the_scheduler_class(
    vllm_python: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "chats.jsonl"
    count = sharegpt_like(trace, conversations_count=30, duration_s=40)
    result = compare(
        str(trace),
        "lru,lpc-const=0.5,lpc-pooled",
        ENGINE,
        PluginSettings(),
        vllm_python,
        records_dir=tmp_path / "records",
        jobs=2,
    )
    assert result["ok"], result["checks"]
    engines = result["vllm"]
    for label in ("lpc-const=0.5", "lpc-pooled"):
        assert engines[label]["through"] == "scheduler-class"
        assert engines[label]["scheduler"] == SCHEDULER_CLASS
        assert engines[label]["queue"] == "LPCSchedulerQueue"
        assert not any(name.startswith("LPC_") for name in engines[label]["environment"])
    assert engines["lpc-pooled"]["additional_config"]["lpc"]["evictor"] == "lpc-pooled"
    assert engines["lru"]["through"] is None and engines["lru"]["additional_config"] is None
    assert engines["lru"]["queue"] == "FreeKVCacheBlockQueue"

    rows = rows_of(result)
    lru, const, pooled = rows["lru"], rows["lpc-const=0.5"], rows["lpc-pooled"]
    assert lru["finished"] == pooled["finished"] == count
    assert result["checks"]["lpc-const=0.5_equals_lru"]["equal"]
    assert const["prefix_cache_hits"] == lru["prefix_cache_hits"]
    assert pooled["prefix_cache_hits"] != lru["prefix_cache_hits"]
    assert pooled["probabilities_from_request"] > 0
    REPORT.append(
        f"lpc vllm-ab through the scheduler class ({count} requests, {lru['steps']} steps): "
        f"lpc-pooled {pooled['prefix_cache_hits']} hit tokens (stock {lru['prefix_cache_hits']}); "
        "lpc-const == stock vLLM"
    )
