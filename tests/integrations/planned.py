"""Our block manager fed a `ReleasePlan`, through the differential test's own replay.

`lpc.difftest.replay.replay_stream` frees each request at time = its step and, since its
requests name no conversation, releases them under their request id. `PlannedLPCEvictor`
looks both up in the plan, so the manager sees exactly the probabilities, conversations and
times the vLLM driver gives the plugin, and the records come from the same code as the LRU
differential test's. Conversations are namespaced by the request's tenant (its `cache_salt`)
as the plugin's trust boundary does (`lpc.integrations.trust`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from types import SimpleNamespace

from eviction import FreedBlocks, LPCEvictor, Release
from lpc.difftest.ops import NewRequest, Stream
from lpc.drivers.release_plan import PluginSettings, ReleasePlan
from lpc.integrations.trust import namespaced, tenant_of


class PlannedLPCEvictor(LPCEvictor):
    def __init__(
        self,
        num_blocks: int,
        plan: ReleasePlan,
        settings: PluginSettings,
        tenants: Mapping[str, str],
    ) -> None:
        super().__init__(num_blocks, settings.scale_per_s, settings.fallback_probability)
        self._plan = plan
        self._tenants = tenants

    def _planned(self, release: Release) -> Release:
        request_id = release.conversation_id
        assert request_id is not None and float(release.time_s).is_integer()
        request = self._plan.request(request_id)
        conversation = request.conversation_id
        return Release(
            self._plan.time_of(int(release.time_s)),
            request.probability,
            request_id
            if conversation is None
            else namespaced(self._tenants.get(request_id, ""), conversation),
        )

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        # vLLM's free queue is handed the freed blocks alone: the plugin never learns the
        # parent of a release's shallowest block, so the manager is given the same view.
        super().push_cached(replace(freed, parent_id=None), self._planned(release))

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        super().note_shared_release(freed, self._planned(release))


def tenants_of(stream: Stream) -> dict[str, str]:
    """Each request's tenant, as the plugin reads it from vLLM's `Request`."""
    return {
        op.request_id: tenant_of(SimpleNamespace(cache_salt=op.cache_salt))
        for op in stream.ops
        if isinstance(op, NewRequest)
    }


def planned_lpc(
    plan: ReleasePlan, settings: PluginSettings, stream: Stream
) -> Callable[[int], LPCEvictor]:
    tenants = tenants_of(stream)
    return lambda num_blocks: PlannedLPCEvictor(num_blocks, plan, settings, tenants)
