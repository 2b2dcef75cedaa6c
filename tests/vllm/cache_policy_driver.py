"""Drive real vLLM's `CPUOffloadingManager` with a cache policy loaded by name and module path;
print what it evicted and what stays resident, as JSON, once as is and once with a chunk
pinned by a load. Run by test_cache_policy.py in the vLLM venv:
`python tests/vllm/cache_policy_driver.py POLICY [MODULE_PATH] [--plugin]`.

With `--plugin` the LPC plugin is registered in this process first and the requests carry
their p in vLLM `Request`s' `extra_args`, not in `kv_transfer_params`: the plugin's release of
each finished request (`release_for`, as `KVCacheManager.free` calls it) is what the CPU tier
reads. The connector's `kv_connector_extra_config` sets the tier's `lpc_horizon_s` (as the
plugin's `Scheduler.__init__` wrapper hands it over), and the JSON adds the policy's horizon
and the plugin's counters. With `--access` too (and `LPC_ACCESS_MODEL` set) the requests carry
no p at all: the plugin's in-process access model predicts each at its release, and the JSON
adds the p the GPU plugin released each request with and the p its resident chunks carry in
the CPU tier."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from vllm.sampling_params import SamplingParams
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.request import Request, RequestStatus

from lpc.integrations import vllm_plugin
from lpc.integrations.config import load_config

TIER_HORIZON_S = 900.0

# (request, probability, number of chunks), in arrival order; the pool holds 4 chunks.
REQUESTS = [("likely", 0.9, 2), ("unlikely", 0.1, 2), ("third", 0.5, 2)]


def finish_on_gpu(rid: str, p: float, access: bool) -> None:
    """What the GPU plugin does when vLLM frees a finished request's blocks."""
    extra_args = {"lpc_conversation_id": f"c-{rid}"}
    if not access:
        extra_args["lpc_probability"] = p
    params = SamplingParams(max_tokens=1, extra_args=extra_args)
    request = Request(rid, [1, 2, 3], params, None)
    request.status = RequestStatus.FINISHED_STOPPED
    runtime = vllm_plugin.registered_runtime()
    assert runtime is not None
    runtime.release_for(request)


def main(policy: str, module_path: str | None, pin: bool, plugin: bool, access: bool) -> dict:
    manager = CPUOffloadingManager(
        num_chunks=4, cache_policy=policy, cache_policy_module_path=module_path
    )
    evicted: dict[str, list[str]] = {}
    all_keys = {}
    for rid, p, n in REQUESTS:
        if rid == "third" and pin:  # a reader loads unlikely-0 and holds it during the store
            reader = ReqContext(req_id="reader")
            manager.on_new_request(reader)
            manager.prepare_load([make_offload_key(b"unlikely-0", 0)], reader)
        params = None if plugin else {"lpc_probability": p, "lpc_conversation_id": rid}
        context = ReqContext(req_id=rid, kv_transfer_params=params)
        manager.on_new_request(context)
        keys = [make_offload_key(f"{rid}-{i}".encode(), 0) for i in range(n)]
        for i, key in enumerate(keys):
            context.set_offload_key_position(key, 16 * (i + 1))
            all_keys[key] = f"{rid}-{i}"
        out = manager.prepare_store(keys, context)
        assert out is not None, f"{rid}: the store failed"
        evicted[rid] = [all_keys[k] for k in out.evicted_keys]
        manager.complete_store(out.keys_to_store, context)
        if plugin:
            finish_on_gpu(rid, p, access)
        manager.on_request_finished(context)
    resident = sorted(
        name
        for key, name in all_keys.items()
        if manager.lookup(key, ReqContext(req_id="probe")) is LookupResult.HIT
    )
    out = {"policy": policy, "pin": pin, "evicted": evicted, "resident": resident}
    if plugin:
        runtime = vllm_plugin.registered_runtime()
        assert runtime is not None
        out["horizon_s"] = getattr(manager._policy.evictor, "horizon_s", None)
        out["stats"] = runtime.stats.snapshot()
        chunks = manager._policy._chunks
        out["gpu_p"] = {rid: runtime.finished.get(rid).probability for rid, _, _ in REQUESTS}
        out["cpu_p"] = {
            name: chunks[key].release.probability for key, name in all_keys.items() if key in chunks
        }
    return out


if __name__ == "__main__":
    plugin, access = "--plugin" in sys.argv, "--access" in sys.argv
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    policy, module_path = args[0], args[1] if len(args) > 1 else None
    if plugin:
        # The LPC_* environment configures it (the access model), as the scheduler class
        # reads it without an `lpc` table; its runtime registered as the class registers it.
        # The requests carry their p as a trusted API layer sets them (`trust`).
        runtime = vllm_plugin.install_runtime(replace(load_config(), trust_request_hints=True))
        runtime.kv_connector_extra_config = {"lpc_horizon_s": TIER_HORIZON_S}
    print(json.dumps([main(policy, module_path, pin, plugin, access) for pin in (False, True)]))
