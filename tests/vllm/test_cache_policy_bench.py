"""`lpc bench cache-policy` against real vLLM 0.33: every policy's worker runs in vLLM's venv
on a small plan, its replay checked to evict what vLLM's manager evicted (the worker fails
otherwise), and the figures come back for all four policies.

Marked `vllm`: run with `pytest -m vllm tests/vllm` after `bash scripts/setup_vllm_venv.sh`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lpc.benchmarks.cache_policy_bench import POLICIES, run

pytestmark = pytest.mark.vllm


def test_all_four_policies_are_timed_on_one_plan(vllm_python: Path) -> None:
    result = run(300, 200, seed=1, runs=1, vllm_python=vllm_python, repeats=1)
    assert set(result.ns_per_op) == set(POLICIES)
    assert all(ns > 0 for ns in result.ns_per_op.values())
    # The tier is full: every policy receives evictions, so the calls differ per policy.
    assert all(ops > 10_000 for ops in result.ops.values())
    assert len(set(result.ops.values())) > 1
    assert set(result.meets_target) == {"lpc", "lpc-pooled"}
    assert all(r is not None and r > 0 for r in result.ratios.values())
