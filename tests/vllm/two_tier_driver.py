"""Replay a stream of requests through real vLLM's `CPUOffloadingManager` the way its
`OffloadingConnector` scheduler drives it, and print each request's CPU hit, as JSON.

Run by test_two_tier_agreement.py (and tests/integrations/test_two_tier_agreement_sample.py) in
the vLLM venv: `python tests/vllm/two_tier_driver.py STREAM.json [STREAM.json ...]`, one line of
JSON per stream, in order, each stream through a fresh manager (one process for several
streams: vLLM's import, about 8 s, is paid once). A stream holds `num_chunks`,
`store_threshold`, `block_size` and `events`: `["arrive", id, [hex key, ...], device_blocks,
max_blocks, t]` (the prompt's full blocks and the GPU prefix cache's hit) or
`["finish", id, t]`. At an arrival: the CPU lookup from the GPU hit on (`lookup`, stopping at
the first miss, as `_maximal_prefix_lookup`), the load of the hit (`prepare_load`,
`complete_load`), then the prompt's store (`prepare_store`, `complete_store`); at a finish,
`on_request_finished`.

The policy is vLLM's built-in `policy` by name (default `lru`; `arc` too), or one loaded from
`module_path`; the output names the class the manager ran (`policy_class`, `policy_module`). With
`gpu_releases` the LPC plugin is registered first (with the stream's `return_model`, if any),
on a clock that reads each event's time `t`, as an engine running LPC's CPU-tier policies has
it: each request carries its conversation (`conversations`) in `kv_transfer_params`, and just
before its finish the GPU plugin's release of it is recorded by request id, as
`KVCacheManager.free` does one step earlier in vLLM, with the request's p
(`gpu_releases["probabilities"]`, for `LPCCachePolicy` and `LPCPooledCachePolicy`) or its
return curve (`gpu_releases["grid"]` and `["survival"]`, for `LPCReturnCachePolicy`); the
plugin is unregistered after the stream, so the next one starts from stock vLLM.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager


class EventClock:
    """The plugin's clock: the time of the event being replayed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def register_plugin(stream: dict, clock: EventClock) -> Any:
    """The LPC plugin registered on `clock` with the stream's return-time model, if any; its
    runtime."""
    from lpc.integrations import vllm_plugin
    from lpc.integrations.config import PluginConfig

    config = PluginConfig(return_model=stream.get("return_model"), stats_log_interval_s=0.0)
    return vllm_plugin.install_runtime(config, clock=clock)


def main(stream: dict) -> dict:
    releases = stream.get("gpu_releases")
    clock = EventClock()
    runtime = register_plugin(stream, clock) if releases is not None else None
    try:
        return replay(stream, clock, runtime, releases)
    finally:
        if runtime is not None:
            from lpc.integrations import vllm_plugin

            vllm_plugin.unregister()


def replay(stream: dict, clock: EventClock, runtime: Any, releases: dict | None) -> dict:
    manager = CPUOffloadingManager(
        num_chunks=stream["num_chunks"],
        cache_policy=stream.get("policy", "lru"),
        cache_policy_module_path=stream.get("module_path"),
        store_threshold=stream["store_threshold"],
    )
    block_size = stream["block_size"]
    conversations: dict[str, str] = stream.get("conversations", {})
    contexts: dict[str, ReqContext] = {}
    host_blocks: dict[str, int] = {}
    stored = evicted = failed = 0
    for event in stream["events"]:
        if event[0] == "finish":
            rid = event[1]
            clock.now = event[2]
            if runtime is not None:
                assert releases is not None
                record_gpu_release(runtime, rid, clock.now, conversations[rid], releases)
            manager.on_request_finished(contexts.pop(rid))
            continue
        _, rid, hex_keys, device_blocks, max_blocks, clock.now = event
        params = {"lpc_conversation_id": conversations[rid]} if rid in conversations else None
        context = ReqContext(req_id=rid, kv_transfer_params=params)
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
    policy = manager._policy
    result: dict[str, Any] = {
        "host_blocks": host_blocks,
        "stored": stored,
        "evicted": evicted,
        "failed": failed,
        "policy_class": type(policy).__name__,
        "policy_module": type(policy).__module__,
    }
    if runtime is not None:
        evictor = policy.evictor
        result.update(
            plugin_errors=runtime.stats.plugin_errors,
            evictor=evictor.name,
            fallbacks_used=getattr(evictor, "fallbacks_used", None),
        )
        if hasattr(evictor, "window_s"):
            result.update(window_s=evictor.window_s, rekeys=evictor.rekeys)
    return result


def record_gpu_release(
    runtime: Any, rid: str, now: float, conversation: str, releases: dict
) -> None:
    """What the GPU plugin records when vLLM frees the finished request: its release, with the
    p or the return curve its in-process model gave (here the replay's, so both see the same)."""
    from eviction.base import Release
    from predictor.return_curve import ReturnCurve

    curve = None
    if "survival" in releases:
        grid = np.asarray(releases["grid"], dtype=np.float64)
        survival = np.asarray(releases["survival"][rid], dtype=np.float64)
        curve = ReturnCurve.of_valid(grid, survival)
    probability = releases.get("probabilities", {}).get(rid)
    runtime.finished.record(rid, Release(now, probability, conversation, return_curve=curve))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        with open(name) as handle:
            print(json.dumps(main(json.load(handle))), flush=True)
