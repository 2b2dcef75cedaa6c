"""One cache policy's ns per operation in vLLM's CPU offload tier; run in vLLM's venv.

`python -m lpc.benchmarks.cache_policy_worker PLAN.json POLICY [MODULE_PATH] [--repeats N]`
prints one JSON line. Real vLLM's `CPUOffloadingManager` drives the policy through the plan
(`cache_policy_plan`) while a proxy records every call; the calls are then replayed into a
fresh policy, checked, and timed against a no-op loop.

How the plan drives the manager and what the figure nets out: docs/design.md, "The CPU-tier
policy benchmark".
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

from lpc.benchmarks.cache_policy_plan import CachePolicyPlan, PlanRequest

POLICY_METHODS = (
    "get",
    "insert",
    "remove",
    "touch",
    "on_store_miss",
    "on_request_access",
    "on_request_finished",
    "evict",
    "mark_evictable",
    "mark_non_evictable",
    "clear",
)

# A recorded step: ("tick", t) | ("ref", chunk_id, ref_cnt) | (method, args, result)
Step = tuple


class Recorder:
    """Stands in for the manager's policy: forwards every call, recording it with the
    request contexts and chunks replaced by indices a replay can rebuild."""

    def __init__(self, policy: Any, contexts: dict[int, int]) -> None:
        self.policy = policy
        self.contexts = contexts  # id(ReqContext) -> request index
        self.steps: list[Step] = []

    def __getattr__(self, name: str) -> Any:
        if name not in POLICY_METHODS:
            return getattr(self.policy, name)
        method = getattr(self.policy, name)

        def call(*args: Any) -> Any:
            if name in ("mark_evictable", "mark_non_evictable"):
                chunk = self.policy.get(args[0])
                self.steps.append(("ref", chunk.chunk_id, 0 if name == "mark_evictable" else 1))
            result = method(*args)
            self.steps.append((name, tuple(self._portable(a) for a in args), _keys_of(result)))
            return result

        return call

    def _portable(self, arg: Any) -> Any:
        if isinstance(arg, ReqContext):
            return ("ctx", self.contexts[id(arg)])
        if isinstance(arg, ChunkStatus):
            return ("chunk", arg.chunk_id)
        if isinstance(arg, (set, frozenset)):
            return set(arg)
        if isinstance(arg, (list, tuple)):
            return [list(a) if isinstance(a, (list, tuple)) else a for a in arg]
        if not isinstance(arg, (int, bytes)) and hasattr(arg, "__iter__"):
            return list(arg)
        return arg


def _keys_of(result: Any) -> Any:
    """An `evict`'s chosen keys (what the checked replay compares); nothing for the rest."""
    if isinstance(result, list):
        return [key for key, _ in result]
    return None


def context_for(request: PlanRequest) -> tuple[ReqContext, list[Any]]:
    """A request's context, carrying its p and conversation as `LPCCachePolicy` reads them,
    and its chunks' keys with their end-token positions."""
    context = ReqContext(
        req_id=request.request_id,
        kv_transfer_params={
            "lpc_probability": request.probability,
            "lpc_conversation_id": request.conversation_id,
        },
    )
    keys = [make_offload_key(k.to_bytes(8, "big"), 0) for k in request.keys]
    for i, key in enumerate(keys):
        context.set_offload_key_position(key, (i + 1) * 16)
    return context, keys


def new_policy(policy: str, module_path: str | None, num_chunks: int, now: list[float]) -> Any:
    """The policy vLLM's factory builds for `policy`, on the logical clock `now` if it
    reads one."""
    manager = CPUOffloadingManager(
        num_chunks=num_chunks, cache_policy=policy, cache_policy_module_path=module_path
    )
    built = manager._policy
    if hasattr(built, "_clock"):
        built._clock = lambda: now[0]
    return manager, built


def record(plan: CachePolicyPlan, policy: str, module_path: str | None) -> tuple[list[Step], dict]:
    """Drive the policy through the plan under vLLM's manager; the calls it received."""
    now = [0.0]
    manager, built = new_policy(policy, module_path, plan.num_chunks, now)
    contexts: dict[int, int] = {}
    recorder = Recorder(built, contexts)
    manager._policy = recorder
    running: list[tuple[ReqContext, list[Any]]] = []
    hits = failed = 0

    def finish(context: ReqContext, loaded: list[Any]) -> None:
        if loaded:
            manager.complete_load(loaded, context)
        manager.on_request_finished(context)

    for index, request in enumerate(plan.requests):
        now[0] = request.time_s
        recorder.steps.append(("tick", request.time_s))
        context, keys = context_for(request)
        contexts[id(context)] = index
        manager.on_new_request(context)
        hit = 0
        for key in keys:
            if manager.lookup(key, context) is not LookupResult.HIT:
                break
            hit += 1
        loaded = keys[:hit]
        if loaded:
            manager.prepare_load(loaded, context)
        hits += hit
        out = manager.prepare_store(keys, context)
        if out is None:
            failed += 1
        else:
            manager.complete_store(out.keys_to_store, context)
        running.append((context, loaded))
        if len(running) > plan.in_flight:
            finish(*running.pop(0))
    for context, loaded in running:
        finish(context, loaded)
    counts = Counter(step[0] for step in recorder.steps if step[0] in POLICY_METHODS)
    return recorder.steps, {"hits": hits, "failed_stores": failed, "calls": dict(counts)}


def build_replay(
    steps: list[Step], plan: CachePolicyPlan, policy: Any, now: list[float], noop: bool
) -> list[tuple[Callable[..., Any], tuple]]:
    """The steps as (function, arguments) on `policy`, with fresh contexts and chunks; with
    `noop`, every policy call goes to a function that does nothing instead."""
    contexts = [context_for(r)[0] for r in plan.requests]
    chunks: dict[int, ChunkStatus] = {}

    def tick(t: float) -> None:
        now[0] = t

    def set_ref(chunk: ChunkStatus, value: int) -> None:
        chunk.ref_cnt = value

    def nothing(*_: Any) -> None:
        return None

    def live(arg: Any) -> Any:
        if isinstance(arg, tuple) and len(arg) == 2 and arg[0] == "ctx":
            return contexts[arg[1]]
        if isinstance(arg, tuple) and len(arg) == 2 and arg[0] == "chunk":
            chunks[arg[1]] = ChunkStatus(arg[1])
            return chunks[arg[1]]
        if isinstance(arg, set):
            return set(arg)
        return arg

    out: list[tuple[Callable[..., Any], tuple]] = []
    for step in steps:
        if step[0] == "tick":
            out.append((tick, (step[1],)))
        elif step[0] == "ref":
            # chunk ids are reused: the chunk is the one inserted last under this id so far
            out.append((set_ref, (chunks[step[1]], step[2])))
        else:
            function = nothing if noop else getattr(policy, step[0])
            out.append((function, tuple(live(a) for a in step[1])))
    return out


def check_replay(steps: list[Step], plan: CachePolicyPlan, policy: str, module: str | None) -> None:
    """Replay once, comparing every eviction with the recorded one."""
    now = [0.0]
    _, fresh = new_policy(policy, module, plan.num_chunks, now)
    replay = build_replay(steps, plan, fresh, now, noop=False)
    for (function, args), step in zip(replay, steps, strict=True):
        result = function(*args)
        if step[0] == "evict" and _keys_of(result) != step[2]:
            raise RuntimeError(f"{policy}: the replay evicted other chunks than the run")


def time_replay(
    steps: list[Step], plan: CachePolicyPlan, policy: str, module: str | None, noop: bool
) -> int:
    now = [0.0]
    _, fresh = new_policy(policy, module, plan.num_chunks, now)
    replay = build_replay(steps, plan, fresh, now, noop)
    started = time.perf_counter_ns()
    for function, args in replay:
        function(*args)
    return time.perf_counter_ns() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("plan")
    parser.add_argument("policy")
    parser.add_argument("module_path", nargs="?")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    # The plan's requests carry their p in kv_transfer_params as an API layer the operator
    # trusts sets it; by default the CPU tier ignores a body's p (`vllm_cache_policy`).
    os.environ["LPC_TRUST_REQUEST_HINTS"] = "1"
    with open(args.plan) as handle:
        plan = CachePolicyPlan.from_dict(json.load(handle))
    steps, info = record(plan, args.policy, args.module_path)
    check_replay(steps, plan, args.policy, args.module_path)
    ops = sum(info["calls"].values())
    best = None
    for _ in range(args.repeats):
        policy_ns = time_replay(steps, plan, args.policy, args.module_path, noop=False)
        loop_ns = time_replay(steps, plan, args.policy, args.module_path, noop=True)
        per_op = max(policy_ns - loop_ns, 0) / ops
        best = per_op if best is None else min(best, per_op)
    print(json.dumps({"policy": args.policy, "ops": ops, "ns_per_op": best, **info}))


if __name__ == "__main__":
    main()
