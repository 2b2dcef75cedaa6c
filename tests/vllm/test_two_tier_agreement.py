"""The two-tier replay's CPU tier against real vLLM 0.33's `CPUOffloadingManager`.

Our replay (`lpc.replay.two_tier`, GPU and CPU tiers both LRU) records, per request, the GPU
hit and the CPU hit that continues it. The same requests, GPU hits and finishes then drive
vLLM's own manager with its built-in `lru` policy (tests/vllm/two_tier_driver.py): every
request's CPU hit, and the numbers of chunks stored and evicted, must agree exactly, with
and without vLLM's store threshold.

Marked `vllm`: run with `pytest -m vllm tests/vllm` after `bash scripts/setup_vllm_venv.sh`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from lpc.replay.ab import ReplaySettings
from lpc.replay.policies import parse_policy
from lpc.replay.simulator import PreparedWorkload, prepare
from lpc.replay.two_tier import RequestTiers, replay_two_tier
from lpc.workload import ARRIVAL, WorkloadConfig, open_loop_requests
from tests.lpc.synthetic import conversations

pytestmark = pytest.mark.vllm

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("two_tier_driver.py")
GPU_TOKENS = 4000
CPU_TOKENS = 16_000  # 1,000 chunks: thousands of CPU hits and of CPU evictions


@pytest.fixture(scope="module")
def workload() -> PreparedWorkload:
    convs = conversations(400, seed=21)
    requests = open_loop_requests(
        convs, WorkloadConfig(duration_s=900, max_active_conversations=30)
    )
    return prepare(requests, 16, {})


def stream_of(workload: PreparedWorkload, served: list[RequestTiers], threshold: int) -> dict:
    by_index = {r.index: r for r in served}
    events: list[list] = []
    bs = workload.block_size
    for _, kind, i in workload.events:
        tiers = by_index.get(i)
        if tiers is None:
            continue  # the GPU pool could not hold it: no tier saw it
        request = workload.cache_requests[i]
        if kind == ARRIVAL:
            keys = [h.hex() for h in request.block_hashes[: request.num_prompt_tokens // bs]]
            events.append(
                ["arrive", request.request_id, keys, tiers.device_blocks, tiers.max_blocks]
            )
        else:
            events.append(["finish", request.request_id])
    return {
        "num_chunks": CPU_TOKENS // bs,
        "store_threshold": threshold,
        "block_size": bs,
        "events": events,
    }


@pytest.mark.parametrize("threshold", [0, 2])
def test_cpu_hits_agree_with_vllm_request_by_request(
    workload: PreparedWorkload, vllm_python: Path, tmp_path: Path, threshold: int
) -> None:
    lru = parse_policy("lru")
    served: list[RequestTiers] = []
    ours = replay_two_tier(
        workload,
        lru,
        lru,
        GPU_TOKENS,
        CPU_TOKENS,
        ReplaySettings(),
        threshold,
        per_request=served,
    )
    # The check has teeth: with vLLM's arc instead of lru, 33 of the 245 requests differ.
    assert ours.host_hit_tokens > 1000 * 16 and ours.host_evictions > 1000
    path = tmp_path / "stream.json"
    path.write_text(json.dumps(stream_of(workload, served, threshold)))
    done = subprocess.run(
        [str(vllm_python), str(DRIVER), str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    vllm = json.loads(done.stdout.strip().splitlines()[-1])
    mine = {workload.cache_requests[r.index].request_id: r.host_blocks for r in served}
    differing = [rid for rid in mine if mine[rid] != vllm["host_blocks"][rid]]
    assert not differing, f"{len(differing)} requests differ, first {differing[:3]}"
    assert vllm["stored"] == ours.host_stored_chunks
    assert vllm["evicted"] == ours.host_evictions
