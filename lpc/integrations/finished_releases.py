"""The GPU plugin's last releases, by request id, for vLLM's CPU offload tier to read.

The CPU tier's `CachePolicy` (`vllm_cache_policy`) never sees vLLM's `Request`, only a
`ReqContext` (request id, `kv_transfer_params`, `kv_hints`), so it cannot run the access model
itself. The GPU plugin computes each finished request's release (p from the request, the
in-process access model, the predictor or the fallback; its conversation) when
`KVCacheManager.free` runs, and the offloading connector reports the same request finished to
the CPU tier one scheduler step later (`OffloadingConnectorScheduler.build_connector_meta`).
This map carries the release across that gap. It is bounded: a step finishes at most
`max_num_seqs` requests, so a few thousand entries outlive any gap; older ones are dropped.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from eviction.base import Release

DEFAULT_FINISHED_RELEASES_KEPT = 4096


@dataclass
class FinishedReleases:
    """Request id -> its release, the most recent `capacity` finished requests."""

    capacity: int = DEFAULT_FINISHED_RELEASES_KEPT
    _releases: OrderedDict[str, Release] = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")

    def record(self, request_id: str, release: Release) -> None:
        with self._lock:
            self._releases[request_id] = release
            self._releases.move_to_end(request_id)
            while len(self._releases) > self.capacity:
                self._releases.popitem(last=False)

    def get(self, request_id: str) -> Release | None:
        # No lock: one dict lookup is atomic, and the CPU tier reads this for every chunk it
        # stores (`vllm_cache_policy.EvictorCachePolicy.insert`).
        return self._releases.get(request_id)

    def __len__(self) -> int:
        return len(self._releases)
