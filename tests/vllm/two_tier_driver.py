"""Replay a stream of requests through real vLLM's `CPUOffloadingManager` the way its
`OffloadingConnector` scheduler drives it, and print each request's CPU hit, as JSON.

Run by test_two_tier_agreement.py in the vLLM venv:
`python tests/vllm/two_tier_driver.py STREAM.json`. The stream holds `num_chunks`,
`store_threshold`, `block_size` and `events`: `["arrive", id, [hex key, ...], device_blocks,
max_blocks]` (the prompt's full blocks and the GPU prefix cache's hit) or `["finish", id]`.
At an arrival: the CPU lookup from the GPU hit on (`lookup`, stopping at the first miss,
as `_maximal_prefix_lookup`), the load of the hit (`prepare_load`, `complete_load`), then
the prompt's store (`prepare_store`, `complete_store`); at a finish, `on_request_finished`.
"""

from __future__ import annotations

import json
import sys

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager


def main(stream: dict) -> dict:
    manager = CPUOffloadingManager(
        num_chunks=stream["num_chunks"],
        cache_policy=stream.get("policy", "lru"),
        store_threshold=stream["store_threshold"],
    )
    block_size = stream["block_size"]
    contexts: dict[str, ReqContext] = {}
    host_blocks: dict[str, int] = {}
    stored = evicted = failed = 0
    for event in stream["events"]:
        if event[0] == "finish":
            manager.on_request_finished(contexts.pop(event[1]))
            continue
        _, rid, hex_keys, device_blocks, max_blocks = event
        context = ReqContext(req_id=rid)
        contexts[rid] = context
        manager.on_new_request(context)
        keys = [make_offload_key(bytes.fromhex(k), 0) for k in hex_keys]
        for i, key in enumerate(keys):
            context.set_offload_key_position(key, (i + 1) * block_size)
        hit = 0
        for key in keys[device_blocks:max_blocks]:
            if manager.lookup(key, context) is not LookupResult.HIT:
                break
            hit += 1
        if hit:
            loaded = keys[device_blocks : device_blocks + hit]
            manager.prepare_load(loaded, context)
            manager.complete_load(loaded, context)
        host_blocks[rid] = hit
        out = manager.prepare_store(keys, context)
        if out is None:
            failed += 1
            continue
        stored += len(out.keys_to_store)
        evicted += len(out.evicted_keys)
        manager.complete_store(out.keys_to_store, context)
    return {"host_blocks": host_blocks, "stored": stored, "evicted": evicted, "failed": failed}


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        print(json.dumps(main(json.load(handle))))
