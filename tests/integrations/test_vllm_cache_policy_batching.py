"""The CPU tier's deferred `mark_evictable` (`EvictorCachePolicy._flush`) against pushing each
chunk when vLLM marks it: on random sequences of vLLM's calls (stores, loads, touches,
finishes, evictions with protected keys, failed stores, the GPU plugin's releases), the
batched policy must evict exactly the chunks the eager one evicts, in the same order, with
one tenant's pinned share capped (the GPU plugin's releases of two tenants' trusted hints)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lpc.integrations.cpu_tier_policy import EvictorCachePolicy, ReturnEvictorCachePolicy
from lpc.integrations.finished_releases import FinishedReleases
from lpc.integrations.vllm_queue import TenantRelease
from predictor.return_curve import ReturnCurve
from tests.integrations.test_vllm_cache_policy import Clock, Context, Status

CAPACITY = 8
POLICY_CLASSES = {
    "lpc": EvictorCachePolicy,
    "lpc-pooled": EvictorCachePolicy,
    "lpc-return": ReturnEvictorCachePolicy,
}
# The GPU plugin's releases carry one of these curves (`lpc-return` reads them).
CURVES = [
    None,
    ReturnCurve(np.array([0.0, 1.0, 30.0]), np.array([1.0, 0.6, 0.1])),
    ReturnCurve(np.array([0.0, 100.0, 1e4]), np.array([1.0, 0.9, 0.2])),
]


class Eager:
    """Each chunk goes to the evictor in the call that makes it evictable (the policy before
    batching); mixed into a policy class."""

    _pending: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mark_evictable = self._mark_now  # type: ignore[method-assign]

    def _mark_now(self, key: Any) -> None:
        self._pending.append(key)
        self._flush()  # type: ignore[attr-defined]

    def insert(self, key: Any, chunk: Any, req_context: Any) -> None:
        super().insert(key, chunk, req_context)  # type: ignore[misc]
        if self._pending:
            self._flush()  # type: ignore[attr-defined]


class EagerPolicy(Eager, EvictorCachePolicy):
    """`Eager` pushes with the LPC policies' releases."""


class EagerReturnPolicy(Eager, ReturnEvictorCachePolicy):
    """`Eager` pushes with the return-time policy's releases."""


@settings(max_examples=40, deadline=None)
@given(evictor=st.sampled_from(list(POLICY_CLASSES)), data=st.data())
def test_deferred_pushes_evict_what_eager_pushes_evict(evictor: str, data: st.DataObject) -> None:
    """A small stand-in for vLLM's `CPUOffloadingManager`: a request loads ready chunks
    (pinned until it finishes), stores new ones (evicting with its keys protected), and
    completes or fails the store; it finishes later (the loads complete, then
    `on_request_finished`). Touches, the GPU plugin's releases and the clock interleave."""
    clock = Clock()
    finished = FinishedReleases()
    batched = POLICY_CLASSES[evictor]
    eager = EagerReturnPolicy if batched is ReturnEvictorCachePolicy else EagerPolicy
    policies = [
        cls(CAPACITY, evictor, clock=clock, finished=finished, pinned_share=0.25)
        for cls in (batched, eager)
    ]
    statuses: list[dict[bytes, Status]] = [{}, {}]  # per policy: key -> its status
    running: list[tuple[Context, list[bytes], list[bytes]]] = []  # context, keys, loaded
    next_key = 0

    def both(method: str, *args: Any) -> list[Any]:
        return [getattr(policy, method)(*args) for policy in policies]

    def add_ref(key: bytes, delta: int) -> int:
        for table in statuses:
            table[key].ref_cnt += delta
        return statuses[0][key].ref_cnt

    for step in range(data.draw(st.integers(1, 25), label="steps")):
        action = data.draw(st.sampled_from(["request", "request", "finish", "touch", "tick"]))
        if action == "request":
            p = data.draw(st.sampled_from([0.1, 0.5, 0.9]))
            conversation = data.draw(st.sampled_from(["a", "b", "c"]))
            context = Context(
                f"r{step}", {"lpc_probability": p, "lpc_conversation_id": conversation}
            )
            ready = [k for k, s in statuses[0].items() if s.ref_cnt >= 0]
            loaded = data.draw(st.lists(st.sampled_from(ready), unique=True)) if ready else []
            for key in loaded:
                if statuses[0][key].ref_cnt == 0:
                    both("mark_non_evictable", key)
                add_ref(key, 1)
            new = [f"k{next_key + i}".encode() for i in range(data.draw(st.integers(0, 3)))]
            next_key += len(new)
            keys = loaded + new
            for depth, key in enumerate(keys):
                context.positions[key] = data.draw(st.sampled_from([depth, 0]))
            need = len(new) - (CAPACITY - len(statuses[0]))
            if need > 0:
                batched, eager = both("evict", need, set(keys))
                assert [k for k, _ in batched or []] == [k for k, _ in eager or []]
                if batched is None:
                    new = []
                for key, _ in batched or []:
                    assert statuses[0][key].ref_cnt == 0, "a pinned chunk was evicted"
                    del statuses[0][key], statuses[1][key]
            for key in new:
                for policy, table in zip(policies, statuses, strict=True):
                    table[key] = Status(0)
                    policy.insert(key, table[key], context)
            fails = data.draw(st.booleans()) and data.draw(st.booleans())
            for key in new:
                if fails:
                    both("remove", key)
                    del statuses[0][key], statuses[1][key]
                else:
                    add_ref(key, 1)  # -1 -> 0: the store completed
                    both("mark_evictable", key)
            running.append((context, loaded + ([] if fails else new), loaded))
        elif action == "finish" and running:
            context, keys, loaded = running.pop(data.draw(st.integers(0, len(running) - 1)))
            if data.draw(st.booleans()):
                curve = data.draw(st.sampled_from(CURVES))
                tenant = data.draw(st.sampled_from(["salt=a", "salt=b"]))
                release = TenantRelease(
                    clock.now, 0.7, "plugin", None, curve, tenant=tenant, hinted=True
                )
                finished.record(context.req_id, release)
            for key in loaded:
                if add_ref(key, -1) == 0:
                    both("mark_evictable", key)
            both(
                "on_request_finished",
                [[k for k in keys if k in statuses[0]]],
                set(),
                set(),
                context,
            )
        elif action == "touch" and running:
            context, keys, _ = data.draw(st.sampled_from(running))
            both("touch", [k for k in keys if k in statuses[0]], context)
            both("on_request_access", [k for k in keys if k in statuses[0]], context)
        elif action == "tick":
            clock.now += data.draw(st.sampled_from([0.5, 2.0, 300.0]))
    for _, _, loaded in running:  # every load completes: nothing stays pinned
        for key in loaded:
            if add_ref(key, -1) == 0:
                both("mark_evictable", key)
    order = [[k for k, _ in policy.evict(len(policy._chunks), set()) or []] for policy in policies]
    assert order[0] == order[1] and len(order[0]) == len(statuses[0])
