"""The releases vLLM 0.33.0's scheduler makes outside `_free_request_blocks`, through the LPC
scheduler class (`lpc.integrations.vllm_scheduler_class`): the evictor is handed each one's
blocks with its release.

One vLLM process drives `LPCScheduler`, and two variants of it, through the same steps,
with a KV connector stand-in (a consumer, under async scheduling: vLLM defers a free while
the step that last ran the request may still write its blocks):

- A finishes while its step runs: vLLM defers the free (`pop_blocks_for_free`) and drains it
  a step later (`_drain_deferred_frees`); two of A's blocks are still held by B, so the
  release notes them for max pooling.
- D's prefix hits A's blocks and the connector loads the rest asynchronously; the load fails
  (`failed_recving`, the `recompute` policy) and vLLM frees D's blocks for a local retry in
  `_update_waiting_for_remote_kv` (`KVCacheManager.free`, called directly): D is not finished,
  so its release is protected.

The class, with either of its overrides taken back to vLLM's method, hands the evictor
something else: the scenario reaches both.

Marked `vllm` (CI step 3); needs vLLM's venv (`vllm_python`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lpc.drivers.vllm_driver import REPO_ROOT
from tests.integrations.snippets import run_snippet

pytestmark = pytest.mark.vllm

SCENARIO = """
import importlib.util, json, sys, tempfile
from pathlib import Path
spec = importlib.util.spec_from_file_location("driver", DRIVER)
driver = importlib.util.module_from_spec(spec)
spec.loader.exec_module(driver)
import torch
from vllm.config import (
    CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
from lpc.integrations import vllm_plugin, vllm_scheduler_class
from lpc.integrations.config import PluginConfig
from lpc.integrations.vllm_queue import LPCFreeBlockQueue

LOADS = {}  # request id -> the tokens the connector loads for it asynchronously, once


class StandIn(KVConnectorBase_V1):
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        tokens = LOADS.pop(request.request_id, 0)
        return tokens, tokens > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass


KVConnectorFactory.register_connector("LPCStandIn", "__main__", "StandIn")
BLOCK, BLOCKS = 16, 24
TABLE = {"evictor": "lpc-pooled", "trust_request_hints": True}
NOW = [0.0]


def clock():
    return NOW[0]


def build(cls):
    folder = Path(tempfile.mkdtemp())
    driver.write_model_config(folder, 256)
    driver.register_standin_architecture()
    config = VllmConfig(
        model_config=ModelConfig(
            model=str(folder), skip_tokenizer_init=True, max_model_len=256, dtype="float32",
            seed=0,
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256,
            enable_chunked_prefill=True, is_encoder_decoder=False, async_scheduling=True,
        ),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="LPCStandIn", kv_role="kv_consumer",
            kv_load_failure_policy="recompute",
        ),
        additional_config={"lpc": TABLE},
    )
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache = KVCacheConfig(
        num_blocks=BLOCKS, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)],
    )
    config.cache_config.num_gpu_blocks = BLOCKS
    return cls(
        vllm_config=config, kv_cache_config=kv_cache,
        structured_output_manager=StructuredOutputManager(config), include_finished_set=False,
        log_stats=True, block_size=BLOCK, hash_block_size=BLOCK,
    )


hash_fn = get_hash_fn_by_name("sha256")
init_none_hash(hash_fn)
hasher = get_request_block_hasher(BLOCK, hash_fn, 0)


def watch(evictor):
    # What the evictor is handed: per call, the blocks and the release's kind, p,
    # conversation and time.
    seen = []
    for name in ("push_cached", "push_protected", "note_shared_release", "note_protected_release"):
        original = getattr(evictor, name)

        def record(freed, release, original=original, name=name):
            seen.append([
                name, list(freed.block_ids), type(release).__name__, release.probability,
                release.conversation_id, release.time_s,
            ])
            return original(freed, release)

        setattr(evictor, name, record)
    return seen


def run(scheduler):
    pool = scheduler.kv_cache_manager.block_pool
    assert scheduler.defer_block_free and isinstance(pool.free_block_queue, LPCFreeBlockQueue)
    seen = watch(pool.free_block_queue.evictor)
    facts = {}

    def add(rid, tokens, p):
        params = SamplingParams(
            max_tokens=64, ignore_eos=True,
            extra_args={"lpc_probability": p, "lpc_conversation_id": rid},
        )
        scheduler.add_request(Request(
            request_id=rid, prompt_token_ids=tokens, sampling_params=params,
            pooling_params=None, arrival_time=NOW[0], block_hasher=hasher,
        ))

    def step(kv=None, finish=()):
        NOW[0] += 0.001
        out = scheduler.schedule()
        for rid in finish:  # while the step runs: vLLM defers the free
            scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
        facts.setdefault("deferred", []).append(len(scheduler.deferred_frees))
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            request = scheduler.requests.get(rid)
            done = request is not None and request.num_computed_tokens >= request.num_tokens
            sampled.append([7] if done else [])
        scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled, kv_connector_output=kv,
        ))

    add("A", list(range(48)), 0.9)
    step()
    add("B", list(range(32)) + list(range(100, 116)), 0.1)
    add("C", list(range(200, 248)), 0.5)
    step()
    step(finish=["A"])
    LOADS["D"] = 48
    add("D", list(range(48)) + list(range(300, 364)), 0.05)
    step()
    facts["loading"] = scheduler.requests["D"].status.name
    step(kv=KVConnectorOutput(finished_recving={"D"}, failed_recving={"D"}))
    step()
    facts["retried"] = scheduler.requests["D"].status.name
    for rid in ("B", "C", "D"):
        NOW[0] += 0.001
        scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
    stats = vllm_plugin.stats_snapshot()
    counters = (
        "releases", "preemptions", "shared_blocks_released", "cached_blocks_released",
        "fallbacks_used", "plugin_errors",
    )
    return {
        "seen": seen,
        "order": [block.block_id for block in pool.free_block_queue.get_all_free_blocks()],
        "stats": {key: stats.get(key) for key in counters},
        "facts": facts,
    }


class NoDrain(vllm_scheduler_class.LPCScheduler):
    _drain_deferred_frees = Scheduler._drain_deferred_frees


class NoFailedLoad(vllm_scheduler_class.LPCScheduler):
    _update_waiting_for_remote_kv = Scheduler._update_waiting_for_remote_kv


CLASSES = {
    "class": vllm_scheduler_class.LPCScheduler, "no drain": NoDrain,
    "no failed load": NoFailedLoad,
}
results = {}
for label in CLASSES:
    NOW[0] = 0.0
    vllm_plugin.install_runtime(PluginConfig(**TABLE), clock=clock)  # the class shares it
    results[label] = run(build(CLASSES[label]))
    vllm_plugin.unregister()
print("RESULTS", json.dumps(results))
"""


@pytest.fixture(scope="module")
def results(vllm_python: Path) -> dict[str, Any]:
    driver = REPO_ROOT / "scripts" / "vllm_scheduler_replay.py"
    out = run_snippet(vllm_python, f"DRIVER = {str(driver)!r}\n" + SCENARIO, {"VLLM_PLUGINS": ""})
    return json.loads(out.split("RESULTS ", 1)[1].splitlines()[0])


def _calls(result: dict[str, Any], conversation: str) -> list[list[Any]]:
    return [call for call in result["seen"] if call[4] == conversation]


def test_the_scenario_defers_a_free_and_fails_a_load(results: dict[str, Any]) -> None:
    for label, result in results.items():
        facts = result["facts"]
        assert facts["deferred"][2] == 1 and facts["deferred"][3] == 0, (label, facts)
        assert facts["loading"] == "WAITING_FOR_REMOTE_KVS", (label, facts)
        assert facts["retried"] == "RUNNING", (label, facts)
        assert result["stats"]["plugin_errors"] == 0, (label, result["stats"])


def test_the_class_hands_the_evictor_each_release(results: dict[str, Any]) -> None:
    """A's deferred free with its release, its shared blocks noted; D's failed load with a
    protected release, its shared blocks noted."""
    through = results["class"]
    assert _calls(through, "A") == [
        ["push_cached", [3], "TenantRelease", 0.9, "A", 0.003],
        ["note_shared_release", [2, 1], "TenantRelease", 0.9, "A", 0.003],
    ]
    assert [call[:3] for call in _calls(through, "D")[:2]] == [
        ["push_protected", [3], "ProtectedRelease"],
        ["note_protected_release", [2, 1], "ProtectedRelease"],
    ]
    assert through["stats"]["preemptions"] == 1


def test_without_the_drain_override_a_deferred_free_loses_its_release(
    results: dict[str, Any],
) -> None:
    through, bare = results["class"], results["no drain"]
    assert _calls(bare, "A") == []  # its blocks took the fallback p, nothing was noted
    anonymous = [call[:4] for call in bare["seen"] if call[4] is None]
    assert anonymous == [["push_cached", [3], "Release", None]]
    assert bare["stats"]["shared_blocks_released"] < through["stats"]["shared_blocks_released"]


def test_without_the_failed_load_override_its_free_is_not_protected(
    results: dict[str, Any],
) -> None:
    through, bare = results["class"], results["no failed load"]
    assert not any(call[2] == "ProtectedRelease" for call in bare["seen"])
    assert bare["stats"]["preemptions"] == through["stats"]["preemptions"] - 1
    assert _calls(bare, "A") == _calls(through, "A")  # the drain still carries A's release
