"""`lpc vllm-ab --through scheduler-class` on stock vLLM 0.33.0: the plugin's policies served
through vLLM's own `--scheduler-cls` (`LPCScheduler`, its settings in `--additional-config`)
schedule as through the plugin's patch points: `lpc-pooled` the same step for step, with the
same hit tokens, and `lpc-const` as stock vLLM. The scheduler sample of
test_vllm_scheduler_sample.py (76 requests), four engines.

Marked `vllm` (CI step 3); needs vLLM's venv (`vllm_python`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lpc.drivers.release_plan import PluginSettings
from lpc.drivers.scheduler_ab import PARITY_FIELDS, compare
from lpc.drivers.vllm_scheduler import SCHEDULER_CLASS, first_divergence
from tests.integrations.report import REPORT
from tests.integrations.test_vllm_scheduler import rows_of, sharegpt_like
from tests.integrations.test_vllm_seam import ENGINE

pytestmark = pytest.mark.vllm


def test_the_scheduler_class_path_serves_as_the_patch_points_do(
    vllm_python: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "chats.jsonl"
    count = sharegpt_like(trace, conversations_count=30, duration_s=40)
    runs = {}
    for through, policies in (
        ("scheduler-class", "lru,lpc-const=0.5,lpc-pooled"),
        ("patch-points", "lpc-pooled"),
    ):
        runs[through] = compare(
            str(trace),
            policies,
            ENGINE,
            PluginSettings(),
            vllm_python,
            records_dir=tmp_path / through,
            jobs=2,
            through=through,
        )
    through_class, points = runs["scheduler-class"], runs["patch-points"]
    assert through_class["ok"], through_class["checks"]
    assert points["ok"], points["checks"]
    assert through_class["through"] == "scheduler-class" and points["through"] == "patch-points"
    engines = through_class["vllm"]
    for label in ("lpc-const=0.5", "lpc-pooled"):
        assert engines[label]["through"] == "scheduler-class"
        assert engines[label]["scheduler"] == SCHEDULER_CLASS
        assert engines[label]["queue"] == "LPCSchedulerQueue"
        assert not any(name.startswith("LPC_") for name in engines[label]["environment"])
    assert engines["lpc-pooled"]["additional_config"]["lpc"]["evictor"] == "lpc-pooled"
    assert engines["lru"]["through"] is None and engines["lru"]["additional_config"] is None
    assert engines["lru"]["queue"] == "FreeKVCacheBlockQueue"
    assert points["vllm"]["lpc-pooled"]["queue"] == "LPCFreeKVCacheBlockQueue"

    rows = rows_of(through_class)
    lru, const, pooled = rows["lru"], rows["lpc-const=0.5"], rows["lpc-pooled"]
    patched = rows_of(points)["lpc-pooled"]
    assert lru["finished"] == pooled["finished"] == count
    assert through_class["checks"]["lpc-const=0.5_equals_lru"]["equal"]
    assert const["prefix_cache_hits"] == lru["prefix_cache_hits"]
    assert pooled["prefix_cache_hits"] == patched["prefix_cache_hits"] != lru["prefix_cache_hits"]
    assert pooled["probabilities_from_request"] == patched["probabilities_from_request"] > 0
    divergence = first_divergence(
        tmp_path / "scheduler-class" / "lpc-pooled.records.jsonl",
        tmp_path / "patch-points" / "lpc-pooled.records.jsonl",
        PARITY_FIELDS,
    )
    assert divergence is None, f"lpc-pooled, scheduler class vs patch points: {divergence}"
    REPORT.append(
        f"lpc vllm-ab --through scheduler-class ({count} requests, {lru['steps']} steps): "
        f"lpc-pooled {pooled['prefix_cache_hits']} hit tokens, as through the patch points at "
        f"every step (stock {lru['prefix_cache_hits']}); lpc-const == stock vLLM"
    )
