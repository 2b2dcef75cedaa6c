"""The two-tier replay's CPU tier against real vLLM 0.33's `CPUOffloadingManager`.

Our replay (`lpc.replay.two_tier`, GPU and CPU tiers both LRU) records, per request, the GPU
hit and the CPU hit that continues it. The same requests, GPU hits and finishes then drive
vLLM's own manager with its built-in `lru` policy (tests/vllm/two_tier_driver.py): every
request's CPU hit, and the numbers of chunks stored and evicted, must agree exactly, with
and without vLLM's store threshold, on a synthetic workload, on a Mooncake sample (one
conversation in 10 of the bundled trace, as tests/integrations/test_vllm_scheduler.py
samples it) and on the whole bundled Mooncake trace (12,031 requests, GPU 2.5M tokens, CPU
8M tokens, block size 512 as the trace's; every request counted, no training part kept
aside). The whole-trace test takes 18 s here (loading, replay and vLLM driver); the whole file,
with the checks of LPC's policies below, 3 min with at most 575 MB resident.

The return-time policy too: our replay with `lpc-return-model` in the CPU tier (the shipped
`models/mooncake-return`'s curve per request) against the manager running
`LPCReturnCachePolicy`, loaded by name and module path with the LPC plugin registered, each
request's curve reaching it through the plugin's release: the same CPU hit for every request
of the Mooncake sample, and the same chunks stored and evicted.

And LPC's own CPU-tier policies: our replay with `lpc` or `lpc-pooled` in the CPU tier (run
inside `LPCCachePolicy` / `LPCPooledCachePolicy`, `lpc.replay.cache_policy_tier`) against the
manager running those classes by name and module path, each request's p reaching them through
the GPU plugin's release (a noisy oracle's p on the synthetic workload, the shipped access
model's on Mooncake): the same CPU hit for every request, the same chunks stored and evicted,
on the synthetic workload and the sample (store threshold 0 and 2) and on the whole trace.
The sizes are ones where the policies' release rules decide some request's CPU hit: run under
`HostTier`'s rules instead, each of these ten checks fails (2 to 20 requests differ on the
synthetic workload, 4 to 8 on the sample, 10 for `lpc` and 3 for `lpc-pooled` on the whole
trace); so do 7 of the 8 synthetic and sample checks if the replay skips the manager's
`on_request_access` calls. They take about 2 minutes together.

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

import numpy as np
import pytest

from lpc.access.source import AccessSource
from lpc.replay.ab import ReplaySettings
from lpc.replay.policies import parse_policy
from lpc.replay.return_sources import load_return_model, model_curves
from lpc.replay.simulator import PreparedWorkload, prepare, request_probabilities
from lpc.replay.two_tier import RequestTiers, replay_two_tier
from lpc.traces.load import TraceOptions, load_trace
from lpc.workload import ARRIVAL, WorkloadConfig, open_loop_requests
from predictor.access_predictor import AccessPredictor
from tests.lpc.synthetic import conversations

pytestmark = pytest.mark.vllm

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("two_tier_driver.py")
GPU_TOKENS = 4000
CPU_TOKENS = 16_000  # 1,000 chunks: thousands of CPU hits and of CPU evictions
RETURN_MODEL = REPO_ROOT / "models" / "mooncake-return"
RETURN_POLICY = "lpc-return-model"
ACCESS_MODEL = REPO_ROOT / "models" / "mooncake-access"
# The CPU-tier policies our replay runs inside their own vLLM class (`CachePolicyTier`).
LPC_POLICIES = {"lpc": "LPCCachePolicy", "lpc-pooled": "LPCPooledCachePolicy"}


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
        "gpu_releases": {
            "grid": grid.tolist(),
            "survival": {
                r.request_id: curve.survival.tolist()  # type: ignore[union-attr]
                for r, curve in zip(workload.requests, curves, strict=True)
            },
        },
    }


def lpc_stream(workload: PreparedWorkload, offload: str) -> dict[str, Any]:
    """What the driver needs to run `offload`'s vLLM class (`LPCCachePolicy`,
    `LPCPooledCachePolicy`) on `workload`: the policy's name and module, each request's
    conversation and the p the GPU plugin releases it with (the one our replay's CPU tier
    reads for `offload`)."""
    spec = parse_policy(offload)
    probabilities = request_probabilities(workload, spec)
    return {
        "policy": LPC_POLICIES[offload],
        "module_path": "lpc.integrations.vllm_cache_policy",
        "conversations": {r.request_id: r.conversation_id for r in workload.requests},
        "gpu_releases": {
            "probabilities": {
                r.request_id: p for r, p in zip(workload.requests, probabilities, strict=True)
            }
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
    CPU tier `offload`: `lru`; `lpc-return-model` against `LPCReturnCachePolicy`; `lpc` or
    `lpc-pooled` against `LPCCachePolicy` or `LPCPooledCachePolicy`) and through vLLM's manager; require at least `least` CPU-hit blocks and CPU evictions (so
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
    elif offload in LPC_POLICIES:
        stream.update(lpc_stream(workload, offload))
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


@pytest.fixture(scope="module")
def workload_p(workload: PreparedWorkload) -> PreparedWorkload:
    """The synthetic workload with a noisy oracle's p per request: high when its conversation
    comes back within 180 s of its completion, low otherwise, each blurred by seeded noise (so
    that `lpc-pooled`'s trust gate takes it, and LPC's order is not LRU's)."""
    rng = np.random.default_rng(5)
    next_arrival: dict[str, float] = {}
    comes_back = {}
    for request in sorted(workload.requests, key=lambda r: r.arrival_s, reverse=True):
        later = next_arrival.get(request.conversation_id)
        comes_back[request.request_id] = later is not None and later <= request.completion_s + 180
        next_arrival[request.conversation_id] = request.arrival_s
    probabilities = [
        float(np.clip((0.8 if comes_back[r.request_id] else 0.2) + rng.normal(0, 0.1), 0.01, 0.99))
        for r in workload.requests
    ]
    return replace(workload, probabilities={"model": probabilities})


def with_access_model(workload: PreparedWorkload) -> PreparedWorkload:
    """`workload` with the shipped access model's p per request, as `lpc ab --trace mooncake`
    computes them (each from what an engine knows at the release)."""
    source = AccessSource(AccessPredictor.load(ACCESS_MODEL))
    return replace(workload, probabilities={"model": source.predict_requests(workload.requests)})


@pytest.fixture(scope="module")
def mooncake_p(mooncake: PreparedWorkload) -> PreparedWorkload:
    return with_access_model(mooncake)


@pytest.fixture(scope="module")
def mooncake_sample_p(mooncake_sample: PreparedWorkload) -> PreparedWorkload:
    return with_access_model(mooncake_sample)


def check_lpc_agreement(
    workload: PreparedWorkload,
    vllm_python: Path,
    tmp_path: Path,
    sizes: tuple[int, int],
    threshold: int,
    least: tuple[int, int],
    offload: str,
) -> None:
    """`check_agreement` for `lpc` or `lpc-pooled` in the CPU tier, and that the check has
    teeth: vLLM ran our class with every request's p, without a fault, and some request's CPU
    hit is not the one LRU in the CPU tier gives it."""
    vllm = check_agreement(workload, vllm_python, tmp_path, sizes, threshold, least, offload)
    assert vllm["policy_class"] == LPC_POLICIES[offload]
    assert vllm["policy_module"] == "lpc.integrations.vllm_cache_policy"
    assert vllm["evictor"] == offload and vllm["plugin_errors"] == 0
    served: list[RequestTiers] = []
    replay_two_tier(
        workload,
        parse_policy("lru"),
        parse_policy("lru"),
        *sizes,
        ReplaySettings(),
        threshold,
        per_request=served,
    )
    lru = {workload.cache_requests[r.index].request_id: r.host_blocks for r in served}
    assert lru != vllm["host_blocks"]


# (CPU tokens, store threshold, least CPU-hit blocks) where HostTier's release rules, run for
# these policies, give some request another CPU hit: the check's teeth (the module docstring).
@pytest.mark.parametrize(
    ("cpu_tokens", "threshold", "least_hits"), [(6000, 0, 1000), (4000, 2, 500)]
)
@pytest.mark.parametrize("offload", sorted(LPC_POLICIES))
def test_lpc_policies_agree_request_by_request(
    workload_p: PreparedWorkload,
    vllm_python: Path,
    tmp_path: Path,
    offload: str,
    cpu_tokens: int,
    threshold: int,
    least_hits: int,
) -> None:
    """245 requests; our replay's CPU tier and vLLM's manager running `LPCCachePolicy` or
    `LPCPooledCachePolicy` give every request the same CPU hit."""
    check_lpc_agreement(
        workload_p,
        vllm_python,
        tmp_path,
        (GPU_TOKENS, cpu_tokens),
        threshold,
        (least_hits, 1000),
        offload,
    )


@pytest.mark.parametrize(("cpu_tokens", "threshold"), [(200_000, 0), (100_000, 2)])
@pytest.mark.parametrize("offload", sorted(LPC_POLICIES))
def test_lpc_policies_agree_on_a_mooncake_sample(
    mooncake_sample_p: PreparedWorkload,
    vllm_python: Path,
    tmp_path: Path,
    offload: str,
    cpu_tokens: int,
    threshold: int,
) -> None:
    """1,218 requests, GPU 250K tokens, the shipped access model's p; CPU tiers small enough
    that the policies' release rules decide some request's CPU hit."""
    check_lpc_agreement(
        mooncake_sample_p,
        vllm_python,
        tmp_path,
        (250_000, cpu_tokens),
        threshold,
        (500, 1000),
        offload,
    )


@pytest.mark.parametrize("offload", sorted(LPC_POLICIES))
def test_lpc_policies_agree_on_the_whole_mooncake_trace(
    mooncake_p: PreparedWorkload, vllm_python: Path, tmp_path: Path, offload: str
) -> None:
    """12,031 requests; GPU 2.5M and CPU 8M tokens, the shipped access model's p."""
    check_lpc_agreement(
        mooncake_p, vllm_python, tmp_path, (2_500_000, 8_000_000), 0, (40_000, 150_000), offload
    )
