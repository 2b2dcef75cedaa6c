"""A sample of `lpc vllm-ab`: vLLM 0.33.0's own `Scheduler`, stock and with the plugin, on a
workload small enough to run in seconds and tight enough that prompts are chunked and
requests preempted.

Marked `vllm`: it runs in CI step 3 (.ci/run), not in the default suite (about 35 s of
engine start-ups). It needs vLLM's venv with the LPC core (`.vllm-venv`, or
`LPC_VLLM_PYTHON`; `scripts/setup_vllm_plugin.sh`, which `scripts/bootstrap.sh --with-vllm`
runs); without it the test is skipped, loudly (the `vllm_python` fixture). The full checks
(the Mooncake sample with the access model, shadow mode, the kill switch, data parallelism, the whole trace) are the vLLM CI step's
(tests/integrations/test_vllm_scheduler.py, marked `vllm`).

What one run shows (each policy in its own vLLM process, the plugin loaded by vLLM's
`load_general_plugins` from its entry point):
- installed but not configured (`VLLM_PLUGINS` unset, so vLLM loads it, and no LPC setting),
  the plugin leaves vLLM stock: the same schedule as stock vLLM at every step, vLLM's own
  queue class;
- `lpc-const` schedules exactly as stock vLLM at every step (tokens per request, chunks,
  preemptions, prefix hits, the blocks allocated), with chunked prefills and preemptions
  actually happening;
- `lpc-pooled` keeps every scheduler invariant (each block free at the end, every reference
  count zero, the queue holding each block once, block ownership consistent at every step),
  every request finishes, each preemption is a protected release, and its order is not
  LRU's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.report import REPORT
from tests.integrations.test_vllm_scheduler import rows_of, run_scheduler_ab, sharegpt_like

# 76 requests of synthetic chats over 40 s in a 2,000-token pool with a 256-token budget:
# about 3,400 scheduler steps, 10 preemptions and 50 chunked prefills.
ENGINE = (
    *("--kv-tokens", "2000", "--block-size", "16", "--max-num-batched-tokens", "256"),
    *("--max-num-seqs", "16", "--step-base-ms", "10", "--step-per-token-us", "100"),
)
POLICIES = ("lru", "installed", "lpc-const=0.5", "lpc-pooled")

pytestmark = pytest.mark.vllm


def test_a_small_workload_through_vllm_scheduler(vllm_python: Path, tmp_path: Path) -> None:
    trace = tmp_path / "chats.jsonl"
    count = sharegpt_like(trace, conversations_count=30, duration_s=40)
    result = run_scheduler_ab(trace, vllm_python, *ENGINE, policies=POLICIES, jobs=len(POLICIES))
    assert result["requests"] == count and result["ok"], result["checks"]
    rows = rows_of(result)
    lru, const, pooled = rows["lru"], rows["lpc-const=0.5"], rows["lpc-pooled"]

    parity = result["checks"]["lpc-const=0.5_equals_lru"]
    assert parity["equal"], parity["first_divergence"]
    assert parity["steps_compared"] == lru["steps"] > 0
    assert lru["preemptions"] > 0, "no request was preempted: the sample tests nothing"
    assert lru["chunked_prefills"] > 0, "no prompt was split over several steps"
    for key in ("prefix_cache_hits", "preemptions", "recomputed_tokens", "chunked_prefills"):
        assert const[key] == lru[key], key
    assert result["vllm"]["lru"]["queue"] == "FreeKVCacheBlockQueue"
    installed = result["checks"]["installed_equals_lru"]
    assert installed["equal"], installed["first_divergence"]
    assert installed["steps_compared"] == lru["steps"]
    assert result["vllm"]["installed"]["queue"] == "FreeKVCacheBlockQueue"
    assert "VLLM_PLUGINS" not in result["vllm"]["installed"]["environment"]
    assert result["vllm"]["lpc-const=0.5"]["queue"] == "LPCSchedulerQueue"

    assert pooled["invariants_ok"], pooled["invariants"]
    assert pooled["finished"] == pooled["requests"] == count
    assert pooled["protected_releases"] == pooled["preemptions"] > 0
    assert pooled["recomputed_evicted_tokens"] <= lru["recomputed_evicted_tokens"]
    order = result["checks"]["lru_order"]["lpc-pooled"]
    assert order["lpc_not_lru"] > 0, "lpc-pooled evicted in LRU's order throughout"
    REPORT.append(
        f"scheduler sample ({count} requests): installed but unconfigured and lpc-const == "
        f"stock vLLM at all {lru['steps']} "
        f"steps ({lru['preemptions']} preemptions, {lru['chunked_prefills']} chunked "
        f"prefills); lpc-pooled invariants hold, {order['lpc_not_lru']} evictions unlike LRU"
    )
