"""`lpc bench queue --manager` against real vLLM 0.33: the four managers (stock, LPC, the
floor queue, the pooled floor) run the same requests and hit the same blocks (the benchmark stops if they do
not), and the LPC side's queue is the scheduler class's, with every request's trusted p
pinning its blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integrations.snippets import run_snippet

pytestmark = pytest.mark.vllm

SNIPPET = """
import json
from lpc.benchmarks.manager_bench import run_manager
from lpc.integrations import vllm_plugin
result = run_manager(64, 12, "lpc-pooled")
print("RESULT", json.dumps({"hit_blocks": result.hit_blocks, "requests": result.requests,
                            "ratios": sorted(result.ratio_p50),
                            "floor_ratios": sorted(result.floor_ratio_p50),
                            "pooled_floor_ratios": sorted(result.pooled_floor_ratio_p50),
                            "registered": vllm_plugin.is_registered()}))
"""


def test_the_manager_benchmark_runs_both_managers_through_the_same_hits(
    vllm_python: Path,
) -> None:
    out = run_snippet(vllm_python, SNIPPET, {"VLLM_PLUGINS": ""})
    record = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert record == {
        "hit_blocks": 2,
        "requests": 12,
        "ratios": ["allocate", "free"],
        "floor_ratios": ["allocate", "free"],  # the floor queue ran the same hits
        "pooled_floor_ratios": ["allocate", "free"],  # and so did the pooled floor
        "registered": False,  # the runtime it installed is gone
    }, out
