"""Our block manager fed a `ReleasePlan`, through the differential test's own replay.

`lpc.difftest.replay.replay_stream` frees each request at time = its step and, since its
requests name no conversation, releases them under their request id. `PlannedLPCEvictor`
looks both up in the plan, so the manager sees exactly the probabilities, conversations and
times the vLLM driver gives the plugin, and the records come from the same code as the LRU
differential test's.
"""

from __future__ import annotations

from collections.abc import Callable

from eviction import FreedBlocks, LPCEvictor, Release
from lpc.drivers.release_plan import PluginSettings, ReleasePlan


class PlannedLPCEvictor(LPCEvictor):
    def __init__(self, num_blocks: int, plan: ReleasePlan, settings: PluginSettings) -> None:
        super().__init__(num_blocks, settings.scale_per_s, settings.fallback_probability)
        self._plan = plan

    def _planned(self, release: Release) -> Release:
        request_id = release.conversation_id
        assert request_id is not None and float(release.time_s).is_integer()
        request = self._plan.request(request_id)
        return Release(
            self._plan.time_of(int(release.time_s)),
            request.probability,
            request.conversation_id or request_id,
        )

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        super().push_cached(freed, self._planned(release))

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        super().note_shared_release(freed, self._planned(release))


def planned_lpc(plan: ReleasePlan, settings: PluginSettings) -> Callable[[int], LPCEvictor]:
    return lambda num_blocks: PlannedLPCEvictor(num_blocks, plan, settings)
