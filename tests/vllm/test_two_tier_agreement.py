"""The two-tier replay's CPU tier against real vLLM 0.33's `CPUOffloadingManager`.

Our replay (`lpc.replay.two_tier`, GPU and CPU tiers both LRU) records, per request, the GPU
hit and the CPU hit that continues it. The same requests, GPU hits and finishes then drive
vLLM's own manager with its built-in `lru` policy (tests/vllm/two_tier_driver.py): every
request's CPU hit, and the numbers of chunks stored and evicted, must agree exactly, with
and without vLLM's store threshold, on a synthetic workload, on a Mooncake sample (one
conversation in 10 of the bundled trace, as tests/integrations/test_vllm_scheduler.py
samples it) and on the whole bundled Mooncake trace (12,031 requests, GPU 2.5M tokens, CPU
8M tokens, block size 512 as the trace's; every request counted, no training part kept
aside). The whole-trace test takes 18 s here (loading, replay and vLLM driver), the whole file
66 s with at most 540 MB resident: it fits the vLLM CI step.

The return-time policy too: our replay with `lpc-return-model` in the CPU tier (the shipped
`models/mooncake-return`'s curve per request) against the manager running
`LPCReturnCachePolicy`, loaded by name and module path with the LPC plugin registered, each
request's curve reaching it through the plugin's release: the same CPU hit for every request
of the Mooncake sample, and the same chunks stored and evicted.

Marked `vllm`: run with `pytest -m vllm tests/vllm` after `bash scripts/setup_vllm_venv.sh`.
"""

from __future__ import annotations

import json
import os
import subprocess
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from lpc.replay.ab import ReplaySettings
from lpc.replay.policies import parse_policy
from lpc.replay.return_sources import load_return_model, model_curves
from lpc.replay.simulator import PreparedWorkload, prepare
from lpc.replay.two_tier import RequestTiers, replay_two_tier
from lpc.traces.load import TraceOptions, load_trace
from lpc.workload import ARRIVAL, WorkloadConfig, open_loop_requests
from tests.lpc.synthetic import conversations

pytestmark = pytest.mark.vllm

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("two_tier_driver.py")
GPU_TOKENS = 4000
CPU_TOKENS = 16_000  # 1,000 chunks: thousands of CPU hits and of CPU evictions
RETURN_MODEL = REPO_ROOT / "models" / "mooncake-return"
RETURN_POLICY = "lpc-return-model"


@pytest.fixture(scope="module")
def workload() -> PreparedWorkload:
    convs = conversations(400, seed=21)
    requests = open_loop_requests(
        convs, WorkloadConfig(duration_s=900, max_active_conversations=30)
    )
    return prepare(requests, 16, {})


@pytest.fixture(scope="module")
def mooncake() -> PreparedWorkload:
    """The whole bundled Mooncake trace at its own block size, 512."""
    return prepare(load_trace("mooncake", TraceOptions()).requests, 512, {})


@pytest.fixture(scope="module")
def mooncake_sample(mooncake: PreparedWorkload) -> PreparedWorkload:
    """One conversation in 10 of it (scripts/sample_conversations.py's rule)."""
    requests = [
        r for r in mooncake.requests if zlib.crc32(r.conversation_id.encode("utf-8")) % 10 == 0
    ]
    return prepare(requests, 512, {})


def stream_of(
    workload: PreparedWorkload, served: list[RequestTiers], threshold: int, cpu_tokens: int
) -> dict:
    by_index = {r.index: r for r in served}
    events: list[list] = []
    bs = workload.block_size
    for time_s, kind, i in workload.events:
        tiers = by_index.get(i)
        if tiers is None:
            continue  # the GPU pool could not hold it: no tier saw it
        request = workload.cache_requests[i]
        if kind == ARRIVAL:
            keys = [h.hex() for h in request.block_hashes[: request.num_prompt_tokens // bs]]
            events.append(
                ["arrive", request.request_id, keys, tiers.device_blocks, tiers.max_blocks, time_s]
            )
        else:
            events.append(["finish", request.request_id, time_s])
    return {
        "num_chunks": cpu_tokens // bs,
        "store_threshold": threshold,
        "block_size": bs,
        "events": events,
    }


def return_stream(workload: PreparedWorkload) -> dict[str, Any]:
    """What the driver needs to run `LPCReturnCachePolicy` on `workload`: the plugin's return
    model, the policy's name and module, each request's conversation and its curve (the ones
    our replay's `lpc-return-model` reads, `workload.curves["model"]`)."""
    curves = workload.curves["model"]
    grid = curves[0].times_s  # type: ignore[union-attr]
    return {
        "policy": "LPCReturnCachePolicy",
        "module_path": "lpc.integrations.vllm_cache_policy",
        "return_model": str(RETURN_MODEL),
        "conversations": {r.request_id: r.conversation_id for r in workload.requests},
        "return_curves": {
            "grid": grid.tolist(),
            "survival": {
                r.request_id: curve.survival.tolist()  # type: ignore[union-attr]
                for r, curve in zip(workload.requests, curves, strict=True)
            },
        },
    }


def check_agreement(
    workload: PreparedWorkload,
    vllm_python: Path,
    tmp_path: Path,
    sizes: tuple[int, int],
    threshold: int,
    least: tuple[int, int],
    offload: str = "lru",
) -> dict[str, Any]:
    """Replay `workload` through our two tiers (GPU and CPU tokens `sizes`, the GPU LRU, the
    CPU tier `offload`: `lru`, or `lpc-return-model` against `LPCReturnCachePolicy`) and
    through vLLM's manager; require at least `least` CPU-hit blocks and CPU evictions (so
    the check has teeth), then the same CPU hit for every request and the same chunks stored
    and evicted. Returns the driver's output."""
    gpu_tokens, cpu_tokens = sizes
    lru = parse_policy("lru")
    served: list[RequestTiers] = []
    ours = replay_two_tier(
        workload,
        lru,
        parse_policy(offload),
        gpu_tokens,
        cpu_tokens,
        ReplaySettings(),
        threshold,
        per_request=served,
    )
    bs = workload.block_size
    assert ours.host_hit_tokens >= least[0] * bs and ours.host_evictions >= least[1]
    stream = stream_of(workload, served, threshold, cpu_tokens)
    if offload == RETURN_POLICY:
        stream.update(return_stream(workload))
    path = tmp_path / "stream.json"
    path.write_text(json.dumps(stream))
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
    vllm["ours"] = ours
    return vllm


@pytest.mark.parametrize("threshold", [0, 2])
def test_cpu_hits_agree_with_vllm_request_by_request(
    workload: PreparedWorkload, vllm_python: Path, tmp_path: Path, threshold: int
) -> None:
    # The check has teeth: with vLLM's arc instead of lru, 33 of the 245 requests differ.
    check_agreement(
        workload, vllm_python, tmp_path, (GPU_TOKENS, CPU_TOKENS), threshold, (1000, 1000)
    )


@pytest.mark.parametrize("threshold", [0, 2])
def test_cpu_hits_agree_on_a_mooncake_sample(
    mooncake_sample: PreparedWorkload, vllm_python: Path, tmp_path: Path, threshold: int
) -> None:
    """1,218 requests; GPU 250K and CPU 800K tokens, a tenth of the whole trace's sizes."""
    check_agreement(
        mooncake_sample, vllm_python, tmp_path, (250_000, 800_000), threshold, (1000, 1000)
    )


def test_cpu_hits_agree_on_the_whole_mooncake_trace(
    mooncake: PreparedWorkload, vllm_python: Path, tmp_path: Path
) -> None:
    """12,031 requests; GPU 2.5M and CPU 8M tokens: 46,127 CPU-hit blocks, 184,199 chunks
    evicted."""
    check_agreement(mooncake, vllm_python, tmp_path, (2_500_000, 8_000_000), 0, (40_000, 150_000))


@pytest.fixture(scope="module")
def mooncake_sample_curves(mooncake_sample: PreparedWorkload) -> PreparedWorkload:
    """The sample with the shipped return-time model's curve per request, as `lpc ab`'s
    `lpc-return-model` computes them (one batched pass, each from what an engine knows at
    the release)."""
    curves = model_curves(load_return_model(RETURN_MODEL), mooncake_sample.requests)
    return replace(mooncake_sample, curves={"model": curves})


@pytest.mark.parametrize("threshold", [0, 2])
def test_the_return_time_policy_agrees_on_a_mooncake_sample(
    mooncake_sample_curves: PreparedWorkload, vllm_python: Path, tmp_path: Path, threshold: int
) -> None:
    """1,218 requests, GPU 250K and CPU 800K tokens (LRU in the GPU tier): our replay's
    `lpc-return-model` CPU tier and vLLM's manager running `LPCReturnCachePolicy` give every
    request the same CPU hit and store and evict the same number of chunks."""
    sizes = (250_000, 800_000)
    vllm = check_agreement(
        mooncake_sample_curves, vllm_python, tmp_path, sizes, threshold, (1000, 1000), RETURN_POLICY
    )
    assert vllm["policy_class"] == "LPCReturnCachePolicy"
    assert vllm["policy_module"] == "lpc.integrations.vllm_cache_policy"
    assert vllm["plugin_errors"] == 0 and vllm["rekeys"] > 0
    # The check has teeth: the return-time order is not LRU's on this sample.
    lru = replay_two_tier(
        mooncake_sample_curves,
        parse_policy("lru"),
        parse_policy("lru"),
        *sizes,
        ReplaySettings(),
        threshold,
    )
    assert lru.host_hit_tokens != vllm["ours"].host_hit_tokens
