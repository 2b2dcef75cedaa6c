"""LPC as vLLM 0.33's CPU-tier `CachePolicy`, loaded by real vLLM by name and module path.

`CPUOffloadingManager` resolves `LPCCachePolicy` through `CachePolicyFactory` from
`lpc.integrations.vllm_cache_policy` and drives it through stores, finishes and a pinning
load (tests/vllm/cache_policy_driver.py). LPC must evict the request least likely to
continue where vLLM's own LRU evicts the oldest, and never a pinned chunk.

Marked `vllm`: run with `pytest -m vllm tests/vllm` after `bash scripts/setup_vllm_venv.sh`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("cache_policy_driver.py")


def drive(vllm_python: Path, *args: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [str(vllm_python), str(DRIVER), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(vllm_python: Path) -> dict[str, list[dict]]:
    return {
        "lpc": drive(vllm_python, "LPCCachePolicy", "lpc.integrations.vllm_cache_policy"),
        "lru": drive(vllm_python, "lru"),
    }


def test_vllm_loads_lpc_by_name_and_evicts_the_unlikely_request(runs) -> None:
    plain = runs["lpc"][0]
    assert sorted(plain["evicted"]["third"]) == ["unlikely-0", "unlikely-1"]
    assert plain["resident"] == ["likely-0", "likely-1", "third-0", "third-1"]
    # vLLM's own LRU on the same calls evicts the oldest request instead.
    assert sorted(runs["lru"][0]["evicted"]["third"]) == ["likely-0", "likely-1"]


def test_a_chunk_pinned_by_a_load_is_never_evicted(runs) -> None:
    pinned = runs["lpc"][1]
    assert "unlikely-0" in pinned["resident"]
    assert "unlikely-0" not in pinned["evicted"]["third"]
    # The other unlikely chunk goes first, then the likely request's tail.
    assert pinned["evicted"]["third"] == ["unlikely-1", "likely-1"]
