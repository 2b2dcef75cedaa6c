"""Drive real vLLM's `CPUOffloadingManager` with a cache policy loaded by name and module path;
print what it evicted and what stays resident, as JSON, once as is and once with a chunk
pinned by a load. Run by test_cache_policy.py in the vLLM venv:
`python tests/vllm/cache_policy_driver.py POLICY [MODULE_PATH]`."""

from __future__ import annotations

import json
import sys

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

# (request, probability, number of chunks), in arrival order; the pool holds 4 chunks.
REQUESTS = [("likely", 0.9, 2), ("unlikely", 0.1, 2), ("third", 0.5, 2)]


def main(policy: str, module_path: str | None, pin: bool) -> dict:
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
        context = ReqContext(
            req_id=rid, kv_transfer_params={"lpc_probability": p, "lpc_conversation_id": rid}
        )
        manager.on_new_request(context)
        keys = [make_offload_key(f"{rid}-{i}".encode(), 0) for i in range(n)]
        for i, key in enumerate(keys):
            context.set_offload_key_position(key, 16 * (i + 1))
            all_keys[key] = f"{rid}-{i}"
        out = manager.prepare_store(keys, context)
        assert out is not None, f"{rid}: the store failed"
        evicted[rid] = [all_keys[k] for k in out.evicted_keys]
        manager.complete_store(out.keys_to_store, context)
        manager.on_request_finished(context)
    resident = sorted(
        name
        for key, name in all_keys.items()
        if manager.lookup(key, ReqContext(req_id="probe")) is LookupResult.HIT
    )
    return {"policy": policy, "pin": pin, "evicted": evicted, "resident": resident}


if __name__ == "__main__":
    policy, module_path = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
    print(json.dumps([main(policy, module_path, pin) for pin in (False, True)]))
