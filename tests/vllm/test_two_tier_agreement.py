"""The two-tier replay's CPU tier against real vLLM 0.33's `CPUOffloadingManager`.

Our replay (`lpc.replay.two_tier`, LRU in the GPU tier) records, per request, the GPU hit and
the CPU hit that continues it. The same requests, GPU hits and finishes then drive vLLM's own
manager (tests/vllm/two_tier_driver.py): every request's CPU hit, and the numbers of chunks
stored and evicted, must agree exactly. This file holds the checks on a synthetic workload (245
requests) and on the whole bundled Mooncake trace (12,031 requests, GPU 2.5M tokens, CPU 8M
tokens, block size 512 as the trace's; every request counted, no training part kept aside),
and the helpers. The same checks on a Mooncake sample (one conversation in 10 of the trace,
as tests/integrations/test_vllm_scheduler.py samples it) run in the default suite:
tests/integrations/test_two_tier_agreement_sample.py.

- vLLM's built-in `lru` against our `lru` (`HostTierPolicy`), with and without vLLM's store
  threshold; on the whole trace 46,127 CPU-hit blocks, 184,199 chunks evicted.
- vLLM's built-in `arc` (`ARCCachePolicy`, selected by name as `lru` is) against our
  `vllm-arc`, its transcription (`lpc.replay.vllm_arc_policy`, run inside `CachePolicyTier`):
  store threshold 0 and 2 on the synthetic workload, 0 on the whole trace (45,299 CPU-hit
  blocks, 200,589 chunks stored, 184,964 evicted). The checks have teeth: the same stream
  through the manager with vLLM's `lru` (in the same driver process) gives 33 and 17 of the 245
  synthetic requests another CPU hit (thresholds 0 and 2) and 592 of the whole trace's 12,031,
  and each check requires some. The replay's `arc` (FAST'03 ARC under `HostTierPolicy`'s rules) is
  another policy: 36 and 19 synthetic requests, 1,218 of the whole trace's, differ from vLLM's
  `arc`.
- LPC's own CPU-tier policies: our replay with `lpc` or `lpc-pooled` in the CPU tier (run inside
  `LPCCachePolicy` / `LPCPooledCachePolicy`, `lpc.replay.cache_policy_tier`) against the manager
  running those classes by name and module path, each request's p reaching them through the GPU
  plugin's release (a noisy oracle's p on the synthetic workload, the shipped access model's on
  Mooncake): the same CPU hit for every request, the same chunks stored and evicted, on the
  synthetic workload (store threshold 0 and 2) and on the whole trace (and on the sample). The
  sizes are ones where the policies' release rules decide some request's CPU hit: run under
  `HostTierPolicy`'s rules instead, each of the ten checks (these six and the sample's four) fails (2
  to 20 requests differ on the synthetic workload, 4 to 8 on the sample, 10 for `lpc` and 3 for
  `lpc-pooled` on the whole trace); so do 7 of the 8 synthetic and sample checks if the replay
  skips the manager's `on_request_access` calls.
- The return-time policy (`lpc-return-model` against `LPCReturnCachePolicy`): on the sample.

The file takes 3 min 34 s here (2 cores shared with other jobs; the whole-trace checks 17 s for
`lru`, 25 s for `vllm-arc` with its `lru` contrast, 28 and 36 s for `lpc` and `lpc-pooled`),
with at most 572 MB resident.

Marked `vllm`: run with `pytest -m vllm tests/vllm` after `bash scripts/setup_vllm_venv.sh`.
"""

from __future__ import annotations

import json
import os
import subprocess
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lpc.access.source import AccessSource
from lpc.replay.ab import ReplayConstants
from lpc.replay.policies import parse_policy
from lpc.replay.return_sources import load_return_model, model_curves
from lpc.replay.simulator import PreparedWorkload, prepare, request_probabilities
from lpc.replay.two_tier import RequestTiers, TwoTierResult, replay_two_tier
from lpc.traces.load import TraceOptions, load_trace
from lpc.workload import ARRIVAL, WorkloadConfig, open_loop_requests
from predictor.access_predictor import AccessPredictor
from tests.lpc.synthetic import conversations

pytestmark = pytest.mark.vllm

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("two_tier_driver.py")
GPU_TOKENS = 4000
CPU_TOKENS = 16_000  # 1,000 chunks: thousands of CPU hits and of CPU evictions
WHOLE_TRACE_SIZES = (2_500_000, 8_000_000)
RETURN_MODEL = REPO_ROOT / "models" / "mooncake-return"
RETURN_POLICY = "lpc-return-model"
ACCESS_MODEL = REPO_ROOT / "models" / "mooncake-access"
# The CPU-tier policies our replay runs inside their own vLLM class (`CachePolicyTier`).
LPC_POLICIES = {"lpc": "LPCCachePolicy", "lpc-pooled": "LPCPooledCachePolicy"}
# Our CPU-tier policy -> vLLM's built-in policy the manager runs by name against it.
VLLM_BUILTIN = {"lru": "lru", "vllm-arc": "arc"}
VLLM_ARC = ("ARCCachePolicy", "vllm.v1.kv_offload.cpu.policies.arc")


def load_mooncake() -> PreparedWorkload:
    """The whole bundled Mooncake trace at its own block size, 512."""
    return prepare(load_trace("mooncake", TraceOptions()).requests, 512, {})


def load_mooncake_sample() -> PreparedWorkload:
    """One conversation in 10 of it (scripts/sample_conversations.py's rule)."""
    requests = [
        r
        for r in load_trace("mooncake", TraceOptions()).requests
        if zlib.crc32(r.conversation_id.encode("utf-8")) % 10 == 0
    ]
    return prepare(requests, 512, {})


def with_access_model(workload: PreparedWorkload) -> PreparedWorkload:
    """`workload` with the shipped access model's p per request, as `lpc ab --trace mooncake`
    computes them (each from what an engine knows at the release)."""
    source = AccessSource(AccessPredictor.load(ACCESS_MODEL))
    return replace(workload, probabilities={"model": source.predict_requests(workload.requests)})


def with_return_curves(workload: PreparedWorkload) -> PreparedWorkload:
    """`workload` with the shipped return-time model's curve per request, as `lpc ab`'s
    `lpc-return-model` computes them (one batched pass, each from what an engine knows at the
    release)."""
    curves = model_curves(load_return_model(RETURN_MODEL), workload.requests)
    return replace(workload, curves={"model": curves})


@pytest.fixture(scope="module")
def workload() -> PreparedWorkload:
    convs = conversations(400, seed=21)
    requests = open_loop_requests(
        convs, WorkloadConfig(duration_s=900, max_active_conversations=30)
    )
    return prepare(requests, 16, {})


@pytest.fixture(scope="module")
def mooncake() -> PreparedWorkload:
    return load_mooncake()


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


@dataclass
class Replayed:
    """Our two-tier replay of `workload` with `offload` in the CPU tier, and the stream that
    drives vLLM's manager through the same requests, GPU hits and finishes."""

    workload: PreparedWorkload
    offload: str
    ours: TwoTierResult
    served: list[RequestTiers]
    stream: dict[str, Any]

    def host_blocks(self) -> dict[str, int]:
        """Each request's CPU hit in our replay, by request id."""
        requests = self.workload.cache_requests
        return {requests[r.index].request_id: r.host_blocks for r in self.served}

    def differing(self, host_blocks: dict[str, int]) -> list[str]:
        """The requests whose CPU hit in `host_blocks` (a driver's) is not ours."""
        return [rid for rid, mine in self.host_blocks().items() if mine != host_blocks[rid]]


def replay_for_vllm(
    workload: PreparedWorkload,
    sizes: tuple[int, int],
    threshold: int,
    least: tuple[int, int],
    offload: str = "lru",
) -> Replayed:
    """Replay `workload` through our two tiers (GPU and CPU tokens `sizes`, the GPU LRU, the
    CPU tier `offload`: `lru` or `vllm-arc` against vLLM's built-in `lru` or `arc`;
    `lpc-return-model` against `LPCReturnCachePolicy`; `lpc` or `lpc-pooled` against
    `LPCCachePolicy` or `LPCPooledCachePolicy`), require at least `least` CPU-hit blocks and
    CPU evictions (so that the check has teeth), and build the driver's stream."""
    gpu_tokens, cpu_tokens = sizes
    served: list[RequestTiers] = []
    ours = replay_two_tier(
        workload,
        parse_policy("lru"),
        parse_policy(offload),
        gpu_tokens,
        cpu_tokens,
        ReplayConstants(),
        threshold,
        per_request=served,
    )
    bs = workload.block_size
    assert ours.host_hit_tokens >= least[0] * bs and ours.host_evictions >= least[1]
    stream = stream_of(workload, served, threshold, cpu_tokens)
    if offload in VLLM_BUILTIN:
        stream["policy"] = VLLM_BUILTIN[offload]
    elif offload == RETURN_POLICY:
        stream.update(return_stream(workload))
    elif offload in LPC_POLICIES:
        stream.update(lpc_stream(workload, offload))
    else:
        raise ValueError(f"no vLLM policy to check {offload} against")
    return Replayed(workload, offload, ours, served, stream)


def run_driver(vllm_python: Path, tmp_path: Path, streams: list[dict]) -> list[dict]:
    """Every stream through vLLM's manager, in one driver process; its outputs, in order."""
    paths = []
    for i, stream in enumerate(streams):
        path = tmp_path / f"stream-{i}.json"
        path.write_text(json.dumps(stream))
        paths.append(str(path))
    done = subprocess.run(
        [str(vllm_python), str(DRIVER), *paths],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()[-len(streams) :]
    return [json.loads(line) for line in lines]


def require_agreement(replayed: Replayed, vllm: dict[str, Any]) -> None:
    """The same CPU hit for every request, and the same chunks stored and evicted."""
    differing = replayed.differing(vllm["host_blocks"])
    assert not differing, f"{len(differing)} requests differ, first {differing[:3]}"
    assert vllm["stored"] == replayed.ours.host_stored_chunks
    assert vllm["evicted"] == replayed.ours.host_evictions


def check_agreement(
    workload: PreparedWorkload,
    vllm_python: Path,
    tmp_path: Path,
    sizes: tuple[int, int],
    threshold: int,
    least: tuple[int, int],
    offload: str = "lru",
    contrast: str | None = None,
) -> dict[str, Any]:
    """`replay_for_vllm`, then the stream through vLLM's manager: the same CPU hit for every
    request and the same chunks stored and evicted. With `contrast` (a vLLM built-in policy),
    the same stream runs through the manager with that policy too, in the same process, and
    the output's `contrast_differing` lists the requests whose CPU hit it changes. Returns the
    driver's output, with our result under `ours`."""
    replayed = replay_for_vllm(workload, sizes, threshold, least, offload)
    streams = [replayed.stream]
    if contrast is not None:
        streams.append({**replayed.stream, "policy": contrast})
    outputs = run_driver(vllm_python, tmp_path, streams)
    vllm = outputs[0]
    require_agreement(replayed, vllm)
    vllm["ours"] = replayed.ours
    if contrast is not None:
        vllm["contrast_differing"] = replayed.differing(outputs[1]["host_blocks"])
    return vllm


def require_vllm_arc(vllm: dict[str, Any]) -> None:
    """The manager ran vLLM's own `ARCCachePolicy`."""
    assert (vllm["policy_class"], vllm["policy_module"]) == VLLM_ARC


@pytest.mark.parametrize("threshold", [0, 2])
def test_cpu_hits_agree_with_vllm_request_by_request(
    workload: PreparedWorkload, vllm_python: Path, tmp_path: Path, threshold: int
) -> None:
    # The check has teeth: with vLLM's arc instead of lru, 33 of the 245 requests differ
    # (17 at threshold 2; the vllm-arc test below).
    check_agreement(
        workload, vllm_python, tmp_path, (GPU_TOKENS, CPU_TOKENS), threshold, (1000, 1000)
    )


@pytest.mark.parametrize(("threshold", "least"), [(0, (2000, 3000)), (2, (1000, 1500))])
def test_vllm_arc_agrees_with_vllm_request_by_request(
    workload: PreparedWorkload,
    vllm_python: Path,
    tmp_path: Path,
    threshold: int,
    least: tuple[int, int],
) -> None:
    """245 requests, GPU 4,000 and CPU 16,000 tokens: our replay's `vllm-arc` CPU tier and the
    manager running vLLM's `arc` give every request the same CPU hit (2,468 and 1,401 CPU-hit
    blocks, 3,953 and 1,788 evictions at thresholds 0 and 2); with vLLM's `lru` on the same
    stream, 33 and 17 requests differ."""
    vllm = check_agreement(
        workload,
        vllm_python,
        tmp_path,
        (GPU_TOKENS, CPU_TOKENS),
        threshold,
        least,
        "vllm-arc",
        contrast="lru",
    )
    require_vllm_arc(vllm)
    assert vllm["contrast_differing"], "vLLM's lru gives every request arc's CPU hit"


def test_cpu_hits_agree_on_the_whole_mooncake_trace(
    mooncake: PreparedWorkload, vllm_python: Path, tmp_path: Path
) -> None:
    """12,031 requests; GPU 2.5M and CPU 8M tokens: 46,127 CPU-hit blocks, 184,199 chunks
    evicted."""
    check_agreement(mooncake, vllm_python, tmp_path, WHOLE_TRACE_SIZES, 0, (40_000, 150_000))


def test_vllm_arc_agrees_on_the_whole_mooncake_trace(
    mooncake: PreparedWorkload, vllm_python: Path, tmp_path: Path
) -> None:
    """12,031 requests; GPU 2.5M and CPU 8M tokens, vLLM's `arc` against our `vllm-arc`:
    45,299 CPU-hit blocks, 200,589 chunks stored, 184,964 evicted; vLLM's `lru` on the same
    stream gives 592 requests another CPU hit."""
    vllm = check_agreement(
        mooncake,
        vllm_python,
        tmp_path,
        WHOLE_TRACE_SIZES,
        0,
        (40_000, 150_000),
        "vllm-arc",
        contrast="lru",
    )
    require_vllm_arc(vllm)
    assert len(vllm["contrast_differing"]) >= 100, len(vllm["contrast_differing"])


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


@pytest.fixture(scope="module")
def mooncake_p(mooncake: PreparedWorkload) -> PreparedWorkload:
    return with_access_model(mooncake)


def require_lpc_teeth(replayed: Replayed, vllm: dict[str, Any]) -> None:
    """For `lpc` or `lpc-pooled` in the CPU tier: vLLM ran our class with every request's p,
    without a fault, and some request's CPU hit is not the one LRU in the CPU tier gives it."""
    offload = replayed.offload
    assert vllm["policy_class"] == LPC_POLICIES[offload]
    assert vllm["policy_module"] == "lpc.integrations.vllm_cache_policy"
    assert vllm["evictor"] == offload and vllm["plugin_errors"] == 0
    ours = replayed.ours
    served: list[RequestTiers] = []
    replay_two_tier(
        replayed.workload,
        parse_policy("lru"),
        parse_policy("lru"),
        ours.cache_tokens,
        ours.offload_tokens,
        ReplayConstants(),
        replayed.stream["store_threshold"],
        per_request=served,
    )
    requests = replayed.workload.cache_requests
    lru = {requests[r.index].request_id: r.host_blocks for r in served}
    assert lru != vllm["host_blocks"]


def check_lpc_agreement(
    workload: PreparedWorkload,
    vllm_python: Path,
    tmp_path: Path,
    sizes: tuple[int, int],
    threshold: int,
    least: tuple[int, int],
    offload: str,
) -> None:
    """`check_agreement` for `lpc` or `lpc-pooled` in the CPU tier, and `require_lpc_teeth`."""
    replayed = replay_for_vllm(workload, sizes, threshold, least, offload)
    (vllm,) = run_driver(vllm_python, tmp_path, [replayed.stream])
    require_agreement(replayed, vllm)
    require_lpc_teeth(replayed, vllm)


# (CPU tokens, store threshold, least CPU-hit blocks) where HostTierPolicy's release rules, run for
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


@pytest.mark.parametrize("offload", sorted(LPC_POLICIES))
def test_lpc_policies_agree_on_the_whole_mooncake_trace(
    mooncake_p: PreparedWorkload, vllm_python: Path, tmp_path: Path, offload: str
) -> None:
    """12,031 requests; GPU 2.5M and CPU 8M tokens, the shipped access model's p."""
    check_lpc_agreement(
        mooncake_p, vllm_python, tmp_path, WHOLE_TRACE_SIZES, 0, (40_000, 150_000), offload
    )
