"""LPC's order for vLLM 0.33's CPU offload tier, without vLLM: the logic of the tier's
`CachePolicy` classes (`lpc.integrations.vllm_cache_policy`, which vLLM loads by name and
module path and which subclass vLLM's `CachePolicy` with `EvictorCachePolicy`).

`LPCCachePolicy` orders chunks with `eviction.lpc.LPCEvictor`, `LPCPooledCachePolicy` with
`eviction.lpc_pooled.PooledLPCEvictor`, `LPCReturnCachePolicy` with
`eviction.return_window.ReturnWindowEvictor`. `EvictorCachePolicy` runs without vLLM (the
two-tier replay and the tests run it). Where a request's p, conversation and curve come from,
how stores and finishes become releases, the fail-safe and the hooks' mapping onto the evictor
contract: docs/design.md, "The CPU tier's policies (`lpc/integrations/cpu_tier_policy.py`)".
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from eviction import FreedBlocks, Release, make_evictor
from eviction.lpc import DEFAULT_FALLBACK_PROBABILITY
from eviction.lpc_pooled import DEFAULT_MEMORY_WINDOW_S, DEFAULT_SHARED_HORIZON_S
from eviction.return_window import ReturnWindowEvictor
from lpc.integrations.config import PluginConfig, PluginConfigError, load_config
from lpc.integrations.finished_releases import FinishedReleases
from lpc.integrations.request_hints import (
    CONVERSATION_KEY,
    PROBABILITY_KEY,
    SIGNATURE_KEY,
    RequestHints,
)
from lpc.integrations.stats import PluginStats, is_probability
from lpc.integrations.trust import HintTrust
from lpc.integrations.vllm_plugin import PluginRuntime, registered_runtime
from lpc.integrations.vllm_queue import MAX_PINNING_TENANTS, TenantRelease

# vLLM class name -> the evictor of `eviction.POLICIES` that orders the chunks
CACHE_POLICY_EVICTORS = {
    "LPCCachePolicy": "lpc",
    "LPCPooledCachePolicy": "lpc-pooled",
    "LPCReturnCachePolicy": "lpc-return",
}
HORIZON_KEY = "lpc_horizon_s"  # in kv_connector_extra_config
HINT_CONVERSATION_KEYS = ("lpc_conversation_id", "conversation_id")  # in a kv_hints payload
# The longest a run of one request's consecutive inserts shares its first insert's release
# (docs/design.md, "The CPU tier's policies", says why); one `prepare_store` loop takes
# microseconds per chunk.
MAX_INSERT_RUN_S = 0.5
# Where the pinned counts of the tenants past MAX_PINNING_TENANTS go (`trust.tenant_of` never
# names a tenant so) and what `pinned_counts` calls them, as the GPU queue does.
OTHER_TENANTS = "*"


@dataclass(slots=True)
class _Chunk:
    """What the policy keeps per resident chunk: vLLM's status object, its evictor slot, the
    release it goes to the evictor with, and whether vLLM lets it be evicted (its store is
    complete and nothing reads it). These records are the truth the evictor is rebuilt from."""

    status: Any
    slot: int
    depth: int
    release: Release
    evictable: bool = False
    provisional: bool = False  # released by a request that has not finished yet
    # `release` reached the evictor, which keeps its key while the chunk is out (protected
    # from a store's evictions, or pinned by a load): it goes back with `requeue`, not as a
    # second release (`_enqueue`).
    pushed: bool = False
    # What the evictor held for the chunk before a running request's access made it
    # provisional (`on_request_access`); restored at the final release, which then pools with
    # it. None: the chunk's only release is provisional (a running request stored it).
    held: Any = None
    # The tenant whose trusted hint pinned the key the evictor keeps for the chunk (None: not
    # pinned); counted in `EvictorCachePolicy._pinned` while the evictor holds the chunk.
    pin: str | None = None


def hinted_conversation(kv_hints: Any) -> str | None:
    """A conversation id carried by one of `kv_hints`' actions (vLLM's `KvHintsEnvelope`:
    actions with a JSON payload), under `lpc_conversation_id` or `conversation_id`."""
    for action in getattr(kv_hints, "actions", None) or ():
        payload = getattr(action, "payload", None)
        if not isinstance(payload, Mapping):
            continue
        for name in HINT_CONVERSATION_KEYS:
            value = payload.get(name)
            if isinstance(value, str) and value:
                return value
    return None


@dataclass(frozen=True, slots=True)
class TierHints:
    """What a request's context may tell the CPU tier, through the trust boundary (`trust`):
    parsed once per request and kept in vLLM's per-request scratch (`ReqContext.set_state`)."""

    probability: float | None = None
    conversation_id: str | None = None
    tenant: str = ""  # `trust.tenant_of` the context: "" for vLLM 0.33's, which carries none


def tier_hints(req_context: Any, trust: HintTrust, stats: PluginStats | None = None) -> TierHints:
    """The request's p and conversation from its context, by the GPU plugin's rules
    (`HintTrust.apply`): an action `lpc-release` in `kv_hints` (vLLM's orchestrator channel)
    is trusted; `kv_transfer_params["lpc_probability"]`, from the request body, only with a
    valid `lpc_signature` beside it or `trust_request_hints`, else ignored and counted in
    `untrusted_probabilities`; the conversation namespaced by the context's tenant. Counted
    once per request where the context keeps state (vLLM's does)."""
    get_state = getattr(req_context, "get_state", None)
    if get_state is not None:
        kept = get_state(TierHints)
        if isinstance(kept, TierHints):
            return kept
    params = getattr(req_context, "kv_transfer_params", None)
    if type(params) is not dict and not isinstance(params, Mapping):
        params = {}
    probability = params.get(PROBABILITY_KEY)
    if probability is not None and not is_probability(probability):
        if stats is not None:
            stats.invalid_probability("a request's kv_transfer_params lpc_probability", probability)
        probability = None
    carried = params.get(CONVERSATION_KEY)
    signature = params.get(SIGNATURE_KEY)
    body = RequestHints(
        None if probability is None else float(probability),
        str(carried) if carried else None,
        signature=signature if isinstance(signature, str) else None,
    )
    trusted, untrusted = trust.apply(req_context, body)
    if untrusted and stats is not None:
        stats.add(untrusted_probabilities=1)
    hints = TierHints(trusted.probability, trusted.conversation_id, trusted.tenant)
    set_state = getattr(req_context, "set_state", None)
    if set_state is not None:
        set_state(hints)
    return hints


UNTRUSTED = HintTrust()  # the default: no client is trusted, no key to check signatures


def request_release(
    req_context: Any,
    now_s: float,
    finished: FinishedReleases | None = None,
    stats: PluginStats | None = None,
    trust: HintTrust = UNTRUSTED,
    running: Callable[[str], Any] | None = None,
) -> Release:
    """The release a request's chunks get at `now_s`; the order of sources is the module's.
    `running`: the GPU plugin's hints of a request it has scheduled (through its own trust
    boundary, the conversation namespaced by the request's tenant), None without the plugin.
    Called at every access and finish of a request: no list of sources, no ABC check for a
    plain dict (`lpc bench cache-policy`).

    The release carries the request's tenant (the GPU plugin's release's, else its running
    hints', else the context's: vLLM 0.33's `ReqContext` carries no `cache_salt` or adapter)
    and whether its p is a trusted hint (the plugin's release says; the context's p is one):
    the tier's pinned cap (`EvictorCachePolicy`). A plain `Release` is the unsalted tenant's
    without a trusted hint (what the replay's requests make)."""
    rid = str(getattr(req_context, "req_id", ""))
    plugin = finished.get(rid) if finished is not None else None
    probability = None
    hinted = False
    value = plugin.probability if plugin is not None else None
    if value is not None:
        if is_probability(value):
            probability = float(value)
            hinted = getattr(plugin, "hinted", False) is True
        elif stats is not None:
            stats.invalid_probability("the GPU plugin's release", value)
    hints = tier_hints(req_context, trust, stats)
    if probability is None:
        probability = hints.probability
        hinted = probability is not None
    named = plugin.conversation_id if plugin is not None else None
    gpu = running(rid) if running is not None and not named else None
    conversation = (
        (named if named and named != rid else None)
        or getattr(gpu, "conversation_id", None)
        or hints.conversation_id
        or hinted_conversation(getattr(req_context, "kv_hints", None))
        or rid
    )
    curve = plugin.return_curve if plugin is not None else None
    tenant = getattr(plugin, "tenant", None)
    if not isinstance(tenant, str):
        tenant = getattr(gpu, "tenant", None)
        if not isinstance(tenant, str):
            tenant = hints.tenant
    if not tenant and not hinted:
        return Release(now_s, probability, conversation, return_curve=curve)
    return TenantRelease(
        now_s, probability, conversation, return_curve=curve, tenant=tenant, hinted=hinted
    )


def tier_trust(runtime: PluginRuntime | None) -> HintTrust:
    """Which hints the CPU tier may use: the GPU plugin's settings when it is registered in
    this engine, else the same settings from the `LPC_*` environment (`trust_request_hints`,
    `hint_key`; a bad one refused at start-up, naming it); by default none."""
    if runtime is not None:
        return runtime.trust
    config = load_config()
    return HintTrust(config.trust_request_hints, config.hint_key)


def tier_pinned_share(runtime: PluginRuntime | None) -> float:
    """One tenant's most pinned share of the tier (`pinned_share`): the GPU plugin's when it
    is registered in this engine, else `LPC_PINNED_SHARE` (a bad one refused at start-up)."""
    config = runtime.config if runtime is not None else load_config()
    return config.pinned_share


def tier_horizon_s(runtime: PluginRuntime | None) -> float:
    """The CPU tier's label horizon: `lpc_horizon_s` of the connector's extra config, else the
    access model's, else the default (docs/design.md, "The CPU tier's
    policies", says why)."""
    if runtime is not None:
        raw = runtime.kv_connector_extra_config.get(HORIZON_KEY)
        if raw is not None:
            if (
                isinstance(raw, bool)
                or not isinstance(raw, int | float)
                or not math.isfinite(raw)
                or raw <= 0
            ):
                raise PluginConfigError(
                    f"kv_connector_extra_config {HORIZON_KEY} must be a finite number > 0, "
                    f"got {raw!r}"
                )
            return float(raw)
        if runtime.access is not None and runtime.access.horizon_s is not None:
            return runtime.access.horizon_s
    return DEFAULT_SHARED_HORIZON_S


def tier_evictor_options(evictor: str, runtime: PluginRuntime | None) -> dict[str, Any]:
    """The evictor's settings: the plugin's (scale, fallback p, floor) when it is registered,
    and for `lpc-pooled` the tier's horizon and a memory window at least that long;
    `lpc-return` keeps its own constants (W from this tier's turnover), as the replay runs it."""
    options: dict[str, Any] = {}
    if evictor == ReturnWindowEvictor.name:
        return options
    if runtime is not None:
        config = runtime.config
        options.update(
            scale_per_s=config.scale_per_s,
            fallback_probability=config.fallback_probability,
            probability_floor=config.probability_floor,
        )
    if evictor == "lpc-pooled":
        horizon_s = tier_horizon_s(runtime)
        options.update(horizon_s=horizon_s, memory_window_s=max(DEFAULT_MEMORY_WINDOW_S, horizon_s))
    return options


# `lpc-pooled`'s sharing memory in this tier: the hash memory. The tier stores chunks one by
# one, not one chain's contiguous tail, which the memory by chain (the GPU queue's) reads.
TIER_POOLED_MEMORY = "content"


class EvictorCachePolicy:
    """vLLM's `CachePolicy` methods over an evictor of `eviction/` (see the module).

    Cost per call (`lpc bench cache-policy`). vLLM calls `get` for every chunk it looks up
    and `mark_evictable` for every chunk whose store or load completes, one call each, so
    both are the dicts' and the list's own C methods, bound on the instance: `get` reads
    a key -> status map, `mark_evictable` appends the key to a list of pending chunks.
    The pending chunks reach the evictor, in call order, before anything reads or changes
    the evictor's order (`_flush`: `evict`, `mark_non_evictable`, `remove`, `touch`,
    `on_request_finished`), consecutive ones of equal release in one push
    (`push_cached_each`, `push_protected_each`: exactly the single pushes' keys and order).
    A run of one request's consecutive inserts shares one `Release` (`_insert_release`).

    `provisional_stores`: whether a running request's releases are provisional (LPC's
    policies: protected keys until its final release; the module) or ordinary releases that
    move every chunk they name (`ReturnEvictorCachePolicy`).

    The pinned cap (`pinned_share`, the GPU queue's rule on chunks): a chunk is pinned while
    the evictor holds it under a key its release's trusted hint put above the fallback p;
    once a second tenant has stored into the tier, a final release whose pushed chunks would
    take its tenant's pinned chunks past `pinned_share` x `cache_capacity` is pushed at the
    fallback p instead (`pinned_share_capped`, once per release). docs/design.md, "The CPU
    tier's policies", says what it bounds."""

    provisional_stores: bool = True

    def __init__(
        self,
        cache_capacity: int,
        evictor: str = "lpc",
        clock: Callable[[], float] = time.monotonic,
        stats: PluginStats | None = None,
        finished: FinishedReleases | None = None,
        trust: HintTrust = UNTRUSTED,
        running: Callable[[str], Any] | None = None,
        pinned_share: float = PluginConfig.pinned_share,
        **evictor_options: Any,
    ) -> None:
        if cache_capacity < 1:
            raise ValueError(f"cache_capacity must be >= 1, got {cache_capacity}")
        if not is_probability(pinned_share):
            raise ValueError(f"pinned_share must be a number in [0, 1], got {pinned_share!r}")
        self.cache_capacity = cache_capacity
        self.stats = stats if stats is not None else PluginStats()
        self.finished = finished
        # Which of a request's context hints the tier may use (`tier_hints`), and the GPU
        # plugin's hints of the requests it is running (`request_release`).
        self.trust = trust
        self.running = running
        self._evictor_name = evictor
        if evictor == "lpc-pooled":  # the engine's tier and the replay's alike
            evictor_options.setdefault("memory", TIER_POOLED_MEMORY)
        self._evictor_options = evictor_options
        self._clock = clock
        self._chunks: dict[Any, _Chunk] = {}
        self._status: dict[Any, Any] = {}  # key -> vLLM's chunk status (what `get` returns)
        self._key_of: dict[int, Any] = {}
        self._free_slots: list[int] = []
        self._pending: list[Any] = []  # keys made evictable, not yet in the evictor
        # (request context, time, the GPU plugin's release, release, final, request id) of the
        # last insert
        self._last_insert: tuple[Any, float, Any, Release, bool, str] | None = None
        # The two per-chunk hooks, without a Python frame (the class's methods say the same).
        self.get = self._status.get  # type: ignore[method-assign]
        self.mark_evictable = self._pending.append  # type: ignore[method-assign]
        self.degraded = False  # the evictor could not be rebuilt: LRU order from the records
        # The pinned cap: each tenant's pinned chunks in the evictor (`_Chunk.pin`), the
        # tenants counted apart (the first MAX_PINNING_TENANTS; later ones share one count),
        # the only tenant that stored so far, whether a second one did (the cap binds), and
        # the last capped release with the release it was pushed as.
        self.pinned_share = float(pinned_share)
        self._pins = evictor in ("lpc", "lpc-pooled")  # lpc-return keys no p
        self._pin_cap = self.pinned_share * cache_capacity
        self._fallback_p = float(
            evictor_options.get("fallback_probability", DEFAULT_FALLBACK_PROBABILITY)
        )
        self._pinned: dict[str, int] = {}
        self._pin_tenants: set[str] = set()
        self._lone_tenant: str | None = None
        self._shared = False
        self._capped: tuple[Release, Release] | None = None
        self.clear()

    # -- CachePolicy ----------------------------------------------------------------------
    def get(self, key: Any) -> Any:
        return self._status.get(key)

    def insert(self, key: Any, chunk: Any, req_context: Any) -> None:
        if not self._free_slots:
            raise RuntimeError(f"insert beyond the capacity of {self.cache_capacity} chunks")
        slot = self._free_slots.pop()
        # `_insert_release`, inlined for the common case (the next insert of a run, the GPU
        # plugin's release of the request unchanged since its first insert).
        last = self._last_insert
        finished = self.finished
        if (
            last is not None
            and last[0] is req_context
            and self._clock() - last[1] <= MAX_INSERT_RUN_S
            and (finished is None or finished.get(last[5]) is last[2])
        ):
            release, final = last[3], last[4]
        else:
            release, final = self._insert_release(req_context)
        try:
            position = req_context.get_offload_key_position(key)
            depth = 0 if position is None else int(position)
        except Exception as error:  # the chunk is kept, at depth 0
            self.stats.plugin_error("the CPU tier's insert", error)
            depth = 0
        provisional = self.provisional_stores and not final
        self._chunks[key] = _Chunk(chunk, slot, depth, release, provisional=provisional)
        self._status[key] = chunk
        self._key_of[slot] = key
        if chunk.ref_cnt == 0:
            self._pending.append(key)

    def remove(self, key: Any) -> None:
        self._last_insert = None
        if self._pending:
            self._flush()
        record = self._chunks.pop(key)
        del self._status[key]
        del self._key_of[record.slot]
        self._free_slots.append(record.slot)
        if not self.degraded:
            if record.evictable:
                self._unpin(record)
            try:
                self._take_out(record, forget=True)
            except Exception as error:
                self._failed("remove", error)

    def touch(self, keys: Iterable[Any], req_context: Any) -> None:
        self._last_insert = None
        self._release_keys("touch", list(keys), req_context, None)

    def on_store_miss(self, keys: Iterable[Any], req_context: Any) -> None:
        """A miss holds nothing to reorder (the keys are not resident yet); it ends a run of
        inserts (the module)."""
        self._last_insert = None

    def on_request_access(self, keys: Iterable[Any], req_context: Any) -> None:
        """vLLM's first sight of `keys` for a request (its `prepare_load`, and its
        `prepare_store` before it evicts): the resident ones are held for the running request
        as its stores are, provisional (after every chunk queued so far, as vLLM's `lru` ranks
        a request's accessed chunks with the request), so that the head of its prompt does
        not go before the tail it stores; what the evictor held for them is kept aside and
        restored at the final release, which pools with it as before (`_rerelease`). A chunk
        another running request holds already moves to this one's place."""
        self._last_insert = None
        chunks = self._chunks
        keys = [key for key in keys if key in chunks]
        if not keys:
            return
        if self._pending:
            self._flush()
        release, final = self._release(req_context, None)
        if final:  # released by the GPU plugin already: its finish follows in this step
            return
        try:
            metadata = None if self.degraded else getattr(self.evictor, "metadata", None)
            for key in keys:
                record = chunks[key]
                if not record.provisional:
                    if metadata is not None:
                        record.held = metadata(record.slot)
                    record.provisional = True
            self._rerelease(keys, release, False)
        except Exception as error:
            self._failed(
                "on_request_access", error, lambda: self._lru_rerelease(keys, release, False)
            )

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[Any]],
        insertion_only_keys: set[Any],
        reused_keys: set[Any],
        req_context: Any,
    ) -> None:
        self._last_insert = None
        keys = [key for group in key_groups for key in group]
        self._release_keys("on_request_finished", keys, req_context, True)

    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, Any]] | None:
        self._last_insert = None
        if n == 0:
            return []
        if self._pending:
            self._flush()
        if not self.degraded:
            try:
                return self._evict(n, protected)
            except Exception as error:
                self.stats.plugin_error("the CPU tier's evict", error)
                self._rebuild()
        return self._evict_lru(n, protected)

    def clear(self) -> None:
        self._chunks.clear()
        self._status.clear()
        self._key_of.clear()
        self._pending.clear()
        self._last_insert = None
        self._free_slots = list(range(self.cache_capacity, 0, -1))
        self._rebuild()

    def mark_evictable(self, key: Any) -> None:
        """The chunk waits in `_pending` for the next `_flush` (the instance binds this to
        the list's `append`)."""
        self._pending.append(key)

    def mark_non_evictable(self, key: Any) -> None:
        self._last_insert = None
        if self._pending:
            self._flush()
        record = self._chunks[key]
        if not record.evictable:
            return
        record.evictable = False
        if not self.degraded:
            self._unpin(record)  # the evictor keeps its key: a requeue counts it again
            try:
                self.evictor.remove(record.slot)
            except Exception as error:
                self._failed("mark_non_evictable", error)

    # -- checks (not vLLM's) -----------------------------------------------------------------
    def __len__(self) -> int:
        """Resident chunks."""
        return len(self._chunks)

    def __iter__(self) -> Iterator[Any]:
        """The resident chunks' keys."""
        return iter(self._chunks)

    def check_invariants(self) -> None:
        """The records, vLLM's statuses and the slots agree, and the evictor holds exactly the
        evictable chunks but those waiting in `_pending` (`_flush` pushes them). Reads only."""
        chunks = self._chunks
        assert chunks.keys() == self._status.keys(), "the records and vLLM's statuses differ"
        assert len(self._key_of) == len(chunks), "a slot is missing its key"
        assert len(chunks) + len(self._free_slots) == self.cache_capacity, "a slot is lost"
        for key, record in chunks.items():
            assert self._key_of[record.slot] == key, f"slot {record.slot} disagrees with its key"
        if self.degraded:
            return
        queued = sum(record.evictable for record in chunks.values())
        self.evictor.check_invariants()
        assert len(self.evictor) == queued, (
            f"the evictor holds {len(self.evictor)} chunks, {queued} are evictable"
        )
        recount: dict[str, int] = {}
        for record in chunks.values():
            if record.evictable and record.pin is not None:
                recount[record.pin] = recount.get(record.pin, 0) + 1
        assert recount == self._pinned, f"pinned counts {self._pinned}, records {recount}"

    def pinned_counts(self) -> dict[str, int]:
        """Each tenant's pinned chunks now (tenants past the table's bound under "*")."""
        return dict(self._pinned)

    # -- the pinned cap ---------------------------------------------------------------------
    def _note_tenant(self, release: Release) -> None:
        """A tenant stored into the tier: the second one shares it with the first, and from
        then on the cap binds."""
        tenant = getattr(release, "tenant", "")  # a plain Release: the unsalted tenant's
        if self._lone_tenant is None:
            self._lone_tenant = tenant
        elif tenant != self._lone_tenant:
            self._shared = True

    def _pin(
        self, release: Release, records: list[_Chunk], whole: bool = True
    ) -> list[tuple[list[_Chunk], Release]]:
        """The final release's push of `records` as the evictor is to take it: (chunks,
        release) parts, each chunk counted against its pinning tenant (`_Chunk.pin`). A
        trusted hint above the fallback p pins, unless the tier is shared and the chunks would
        take the tenant's pinned chunks past the cap: then the fallback p at the release's
        time (LRU's place), counted once per release, and the release's later pushes stay
        capped. `whole`: one decision for the push (the GPU queue's, per release); else chunk
        by chunk in the given order, as single pushes would decide (`_enqueue_in_order`:
        batching changes nothing)."""
        capped = self._capped
        if capped is not None and capped[0] is release:
            self._count_pins(records, None)
            return [(records, capped[1])]
        if not self._shared:  # its chunks are in the tier: its tenant stored or loaded them
            self._note_tenant(release)
        p = release.probability
        if (
            not self._pins
            or type(release) is not TenantRelease
            or not release.hinted
            or p is None
            or not p > self._fallback_p
        ):
            self._count_pins(records, None)
            return [(records, release)]
        tenant = release.tenant
        if tenant not in self._pin_tenants:
            if len(self._pin_tenants) >= MAX_PINNING_TENANTS:
                tenant = OTHER_TENANTS
            else:
                self._pin_tenants.add(tenant)
        n = len(records)
        room = n
        if self._shared:
            room = min(n, max(0, math.floor(self._pin_cap - self._pinned.get(tenant, 0))))
            if whole and room < n:
                room = 0
        parts = []
        if room:
            pinned = records[:room] if room < n else records
            self._count_pins(pinned, tenant)
            parts.append((pinned, release))
        if room < n:
            keyed = replace(release, probability=None)
            self._capped = (release, keyed)
            self.stats.add(pinned_share_capped=1)
            rest = records[room:]
            self._count_pins(rest, None)
            parts.append((rest, keyed))
        return parts

    def _count_pins(self, records: Sequence[_Chunk], tenant: str | None) -> None:
        """Chunks the evictor takes with a fresh key: pinned by `tenant`, or not (None)."""
        for record in records:
            record.pin = tenant
        if tenant is not None:
            self._pinned[tenant] = self._pinned.get(tenant, 0) + len(records)

    def _pins_back(self, records: Sequence[_Chunk]) -> None:
        """Chunks back in the evictor with the keys it kept (`requeue`): counted again."""
        pinned = self._pinned
        for record in records:
            tenant = record.pin
            if tenant is not None:
                pinned[tenant] = pinned.get(tenant, 0) + 1

    def _unpin(self, record: _Chunk) -> None:
        """An evictable chunk left the evictor: out of its tenant's count."""
        tenant = record.pin
        if tenant is not None:
            left = self._pinned[tenant] - 1
            if left:
                self._pinned[tenant] = left
            else:
                del self._pinned[tenant]

    # -- internals --------------------------------------------------------------------------
    def _flush(self, finishing: Container[Any] = ()) -> set[Any]:
        """Hand the pending chunks to the evictor (`mark_evictable`'s deferred part), in call
        order. The evictor sees what one push per call would have shown it: consecutive
        chunks of equal release and kind go in one `push_*_each`, which the evictors of the
        LPC family make equal to their single pushes; others get one push per chunk. An
        unknown key is counted as an error of `mark_evictable`, as its own call would be.

        `finishing`: the keys a request's final release re-keys next (`_release_keys`). A
        provisional chunk among them would be pushed with the protected key only to be taken
        out again, its metadata forgotten or restored, and pushed with the final release:
        that push leaves nothing behind (no key, tag or count outlives `forget` and
        `restore_metadata`, and other blocks keep their order), so such chunks become
        evictable without it. Returns their keys, for `_rerelease` (empty when the evictor
        was rebuilt here: the rebuild queued every evictable chunk)."""
        keys = self._pending[:]
        self._pending.clear()
        chunks = self._chunks
        records = []
        unqueued: set[Any] = set()
        unknown = None
        for key in keys:
            record = chunks.get(key)
            if record is None:
                unknown = key
            elif not record.evictable:
                record.evictable = True
                if record.provisional and not record.pushed and key in finishing:
                    unqueued.add(key)
                else:
                    records.append(record)
        try:
            if records and not self.degraded:
                self._enqueue_in_order(records)
            if unknown is not None:
                raise KeyError(f"mark_evictable of a chunk not in the tier: {unknown!r}")
        except Exception as error:
            self._failed("mark_evictable", error)
            return set()
        return unqueued

    def _enqueue_in_order(self, records: list[_Chunk]) -> None:
        """Push chunks in the order given, one push per run of equal (release, kind); a run of
        chunks back from a load whose release the evictor has seen goes back to its place
        (`requeue`, as in `_enqueue`)."""
        evictor = self.evictor
        key_of = self._key_of
        requeue = getattr(evictor, "requeue", None)
        n = len(records)
        i = 0
        while i < n:
            first = records[i]
            if requeue is not None and first.pushed:  # back from a load: its place again
                j = i + 1
                while j < n and records[j].pushed:
                    j += 1
                group = records[i:j]
                i = j
                slots = [r.slot for r in group]
                requeue(FreedBlocks(slots, [r.depth for r in group], [key_of[s] for s in slots]))
                self._pins_back(group)
                continue
            release, provisional = first.release, first.provisional
            j = i + 1
            while j < n:
                other = records[j]
                if (
                    (requeue is not None and other.pushed)
                    or other.provisional is not provisional
                    or (other.release is not release and other.release != release)
                ):
                    break
                j += 1
            group = records[i:j]
            i = j
            for record in group:
                record.pushed = True
            if provisional:
                each = getattr(evictor, "push_protected_each", None)
                single = getattr(evictor, "push_protected", evictor.push_cached)
                self._count_pins(group, None)
                parts = [(group, release)]
            else:
                each = getattr(evictor, "push_cached_each", None)
                single = evictor.push_cached
                parts = self._pin(release, group, whole=False)
            for part, keyed in parts:
                if each is not None:
                    slots = [r.slot for r in part]
                    each(
                        FreedBlocks(slots, [r.depth for r in part], [key_of[s] for s in slots]),
                        keyed,
                    )
                else:
                    for r in part:
                        single(FreedBlocks([r.slot], [r.depth], [key_of[r.slot]]), keyed)

    def _insert_release(self, req_context: Any) -> tuple[Release, bool]:
        """`_release` for an insert: a run of one request's consecutive inserts (one
        `prepare_store`) shares its first insert's release, so that its chunks differ in depth
        only (the tail goes first) and group into one push. Any other hook ends the run."""
        now = self._clock()
        finished = self.finished
        plugin = None
        rid = ""  # read only with the GPU plugin's releases
        if finished is not None:
            try:
                rid = str(getattr(req_context, "req_id", ""))
                plugin = finished.get(rid)
            except Exception:  # `_release` counts it
                plugin = None
        last = self._last_insert
        if (
            last is not None
            and last[0] is req_context
            and now - last[1] <= MAX_INSERT_RUN_S
            and last[2] is plugin
        ):
            return last[3], last[4]
        release, final = self._release(req_context, None, now)
        self._last_insert = (req_context, now, plugin, release, final, rid)
        if not self._shared:
            self._note_tenant(release)
        return release, final

    def _release(
        self, req_context: Any, final: bool | None, now: float | None = None
    ) -> tuple[Release, bool]:
        """`request_release`, or on an error in it the fallback p at the current time; and
        whether it is the request's final release: at `on_request_finished` (`final` True), or
        once the GPU plugin has released the finished request (`final` None: look)."""
        if now is None:
            now = self._clock()
        try:
            if final is None:
                rid = str(getattr(req_context, "req_id", ""))
                final = self.finished is not None and self.finished.get(rid) is not None
            release = request_release(
                req_context, now, self.finished, self.stats, self.trust, self.running
            )
            return release, final
        except Exception as error:
            self.stats.plugin_error("the CPU tier's request release", error)
            rid = getattr(req_context, "req_id", None)
            return Release(now, None, rid if isinstance(rid, str) else None), bool(final)

    def _release_keys(
        self, hook: str, keys: list[Any], req_context: Any, final: bool | None
    ) -> None:
        """Give `keys` (head to tail) the request's release; on an error LRU's move to the
        most recent place: the fallback p at the current time."""
        unqueued: set[Any] = set()
        if self._pending:
            # A final release re-keys every chunk it names: the provisional ones waiting to be
            # queued skip their protected push when the evictor forgets it anyway (`_flush`).
            skip = final is True and self.provisional_stores and self._forgets()
            unqueued = self._flush(set(keys) if skip else ())
        release, final = self._release(req_context, final)
        drop = self._stale_conversation(req_context, release, final)
        # Without provisional releases every release moves every chunk it names.
        final = final or not self.provisional_stores
        try:
            self._rerelease(keys, release, final, drop, unqueued)
        except Exception as error:
            self._failed(hook, error, lambda: self._lru_rerelease(keys, release, final))

    def _stale_conversation(self, req_context: Any, release: Release, final: bool) -> str | None:
        """A conversation whose claim the release's chunks drop first (`_rerelease`); none
        here (LPC's policies forget a provisional chunk's key instead)."""
        return None

    def _lru_rerelease(self, keys: list[Any], release: Release, final: bool) -> None:
        """`_release_keys`' fallback: the records take the fallback p at the current time."""
        fallback = Release(self._clock(), None, release.conversation_id)
        for key in keys:
            record = self._chunks.get(key)
            if record is not None and (final or record.provisional):
                record.release, record.provisional = fallback, not final
                record.pushed = False
                if final:
                    record.held = None

    def _failed(
        self, hook: str, error: Exception, fallback: Callable[[], None] | None = None
    ) -> None:
        """An exception in LPC's part of a hook: counted, logged once, and the evictor is
        rebuilt from the records (after `fallback` fixed them up): vLLM never sees it."""
        self.stats.plugin_error(f"the CPU tier's {hook}", error)
        if fallback is not None:
            try:
                fallback()
            except Exception as second:
                self.stats.plugin_error(f"the CPU tier's {hook} fallback", second)
        self._rebuild()

    def _forgets(self) -> bool:
        """Whether the evictor drops and restores a chunk's metadata (`forget`,
        `restore_metadata`): a final release then erases what a provisional push left."""
        if self.degraded:  # no evictor to push to (`_flush` pushes nothing)
            return False
        evictor = self.evictor
        return hasattr(evictor, "forget") and hasattr(evictor, "restore_metadata")

    def _rerelease(
        self,
        keys: list[Any],
        release: Release,
        final: bool,
        drop: str | None = None,
        unqueued: Container[Any] = (),
    ) -> None:
        """Give `keys` the request's release; evictable ones go back to the evictor tail
        first, pinned ones keep it for when they become evictable. With `drop`, the chunks
        first lose that conversation's claim (`ReturnEvictorCachePolicy`).

        A final release re-keys every chunk. Re-queued chunks keep their pooling metadata
        (`RunHeap.remove` leaves it), so a chunk shared with another conversation keeps the
        larger key (max pooling); a chunk whose only release was provisional forgets it first,
        so the request's final p (and conversation) replaces it rather than pooling with it.
        A provisional release (a running request's touch) moves only provisional chunks: the
        others keep the keys their conversations' releases gave them. `unqueued`: evictable
        chunks `_flush` left out of the evictor (there is nothing to take out)."""
        chunks = self._chunks
        provisional = not final
        if self.degraded:
            for key in keys:
                record = chunks.get(key)
                if record is not None and (final or record.provisional):
                    record.release = release
                    record.pushed = False
                    record.provisional = provisional
                    if final:
                        record.held = None
            return
        evictor = self.evictor
        remove = evictor.remove
        forget = getattr(evictor, "forget", None) if final else None
        restore = getattr(evictor, "restore_metadata", None)
        drop_claim = evictor.drop_claim if drop is not None else None  # type: ignore[union-attr]
        requeued = []
        # One pass, chunk by chunk in the given order (the evictor's calls in the order of
        # two passes: no call reads another chunk's record).
        for key in keys:
            record = chunks.get(key)
            if record is None or not (final or record.provisional):
                continue
            record.release = release
            record.pushed = False
            if record.evictable:
                if not unqueued or key not in unqueued:
                    remove(record.slot)
                    self._unpin(record)
                requeued.append(record)
            if forget is not None and record.provisional:
                held = record.held
                if held is not None:  # held by a running request's access
                    restore(record.slot, held)  # type: ignore[misc]
                    record.held = None
                else:
                    forget(record.slot)
            if drop_claim is not None:
                drop_claim(record.slot, drop)
            record.provisional = provisional
        if requeued:
            # One release and kind, none pushed with it yet: one push, nothing for
            # `_enqueue` to look for (the release path of every request).
            requeued.sort(key=_DEPTH, reverse=True)  # stable: ties keep their order
            self._push_sorted(requeued, release, provisional)

    def _push_sorted(self, records: list[_Chunk], release: Release, provisional: bool) -> None:
        """One push of evictable chunks of one release and kind, sorted tail first, none
        pushed with it yet: protected for a provisional release, cached for a final one."""
        key_of = self._key_of
        slots = []
        for record in records:
            record.pushed = True
            slots.append(record.slot)
        freed = FreedBlocks(slots, [r.depth for r in records], [key_of[s] for s in slots])
        evictor = self.evictor
        if provisional:
            self._count_pins(records, None)
            getattr(evictor, "push_protected", evictor.push_cached)(freed, release)
        else:
            release = self._pin(release, records)[0][1]  # one part: the whole push decides
            evictor.push_cached(freed, release)

    def _take_out(self, record: _Chunk, forget: bool) -> None:
        """Take an evictable chunk out of the evictor; with `forget`, drop its metadata too."""
        if record.evictable:
            self.evictor.remove(record.slot)
        if forget and hasattr(self.evictor, "forget"):
            self.evictor.forget(record.slot)

    def _enqueue(self, records: list[_Chunk]) -> None:
        """Hand evictable chunks to the evictor tail first, grouped by their release. A
        provisional release queues its chunks as the GPU plugin queues a preempted request's
        (`push_protected`: after every chunk queued so far, LRU's place for a fresh insert,
        nothing learned from it); a final one is an ordinary release (`push_cached`). A chunk
        whose release the evictor has seen already (`_Chunk.pushed`) goes back to the place
        it left (`requeue`, where the evictor's keys are static: the LPC family); the
        return-time evictor, whose keys move with its window, takes the release again."""
        if not records:
            return
        if len(records) > 1:
            records = sorted(records, key=_DEPTH, reverse=True)  # stable: ties keep their order
        evictor = self.evictor
        key_of = self._key_of
        requeue = getattr(evictor, "requeue", None)
        if requeue is not None and any(r.pushed for r in records):
            back = [r for r in records if r.pushed]
            slots = [r.slot for r in back]
            requeue(FreedBlocks(slots, [r.depth for r in back], [key_of[s] for s in slots]))
            self._pins_back(back)
            records = [r for r in records if not r.pushed]
            if not records:
                return
        by_release: dict[tuple[int, bool], list[_Chunk]] = {}
        for record in records:
            by_release.setdefault((id(record.release), record.provisional), []).append(record)
        for (_, provisional), group in by_release.items():
            self._push_sorted(group, group[0].release, provisional)

    def _evict(self, n: int, protected: set[Any]) -> list[tuple[Any, Any]] | None:
        """The evictor's choice; records change only once it is complete, so an exception on
        the way leaves them as they were (the caller rebuilds the evictor from them)."""
        chunks = self._chunks
        shielded = []
        for key in protected:
            record = chunks.get(key)
            if record is not None and record.evictable:
                shielded.append(record)
        evictor = self.evictor
        if len(evictor) - len(shielded) < n:
            return None
        for record in shielded:
            evictor.remove(record.slot)
            self._unpin(record)
        slots = evictor.pop_n(n, self._clock())
        self._enqueue(shielded)
        key_of = self._key_of
        return [self._drop(key_of[slot]) for slot in slots]

    def _evict_lru(self, n: int, protected: set[Any]) -> list[tuple[Any, Any]] | None:
        """LRU's choice from the records: the oldest releases first, tail first."""
        candidates = [
            (record.release.time_s, -record.depth, i, key)
            for i, (key, record) in enumerate(self._chunks.items())
            if record.evictable and key not in protected
        ]
        if len(candidates) < n:
            return None
        candidates.sort()
        evicted = [self._drop(key) for *_, key in candidates[:n]]
        if not self.degraded:
            self._rebuild()
        return evicted

    def _drop(self, key: Any) -> tuple[Any, Any]:
        record = self._chunks.pop(key)
        if record.evictable:
            self._unpin(record)
        del self._status[key]
        del self._key_of[record.slot]
        self._free_slots.append(record.slot)
        return key, record.status

    def _rebuild(self) -> None:
        """A new evictor holding exactly the evictable records; if that fails, LRU order from
        the records from now on (`degraded`)."""
        self._clear_pins()
        try:
            self.evictor = make_evictor(
                self._evictor_name, self.cache_capacity + 1, **self._evictor_options
            )
            self.evictor.reset([])
            self.degraded = False
            for record in self._chunks.values():
                record.pushed = False  # the new evictor has seen no release
            self._enqueue([r for r in self._chunks.values() if r.evictable])
        except Exception as error:
            self.stats.plugin_error("rebuilding the CPU tier's evictor", error)
            self.degraded = True
            self._clear_pins()  # no evictor: no key above LRU's place

    def _clear_pins(self) -> None:
        """No chunk pinned (the evictor is new or gone)."""
        self._pinned.clear()
        for record in self._chunks.values():
            record.pin = None


class ReturnEvictorCachePolicy(EvictorCachePolicy):
    """`EvictorCachePolicy` over the return-window evictor, with the two-tier replay's
    releases (the module's "The return-time policy"): no provisional releases, a request's
    first access to resident chunks re-releases them, and its final release drops the claim
    its store-time releases made under another conversation id."""

    provisional_stores = False

    def __init__(
        self,
        cache_capacity: int,
        evictor: str = ReturnWindowEvictor.name,
        clock: Callable[[], float] = time.monotonic,
        stats: PluginStats | None = None,
        finished: FinishedReleases | None = None,
        trust: HintTrust = UNTRUSTED,
        running: Callable[[str], Any] | None = None,
        pinned_share: float = PluginConfig.pinned_share,
        **evictor_options: Any,
    ) -> None:
        super().__init__(
            cache_capacity,
            evictor,
            clock,
            stats,
            finished,
            trust,
            running,
            pinned_share,
            **evictor_options,
        )

    def on_request_access(self, keys: Iterable[Any], req_context: Any) -> None:
        """vLLM's first sight of `keys` for this request (at `prepare_load`, and at
        `prepare_store` before it evicts): the resident ones take the request's release now,
        as the replay's offer re-releases the chunks it finds resident."""
        self._last_insert = None
        chunks = self._chunks
        resident = [key for key in keys if key in chunks]
        if resident:
            self._release_keys("on_request_access", resident, req_context, None)

    def _stale_conversation(self, req_context: Any, release: Release, final: bool) -> str | None:
        """At a final release: the conversation the tier gave the request's store-time
        releases, when it is not the final one's (the GPU plugin named the conversation, the
        request's context did not)."""
        if not final:
            return None
        try:
            stored_as = request_release(
                req_context, release.time_s, trust=self.trust, running=self.running
            ).conversation_id
        except Exception as error:  # the claim pools with the final one; nothing else changes
            self.stats.plugin_error("the CPU tier's store-time conversation", error)
            return None
        return stored_as if stored_as != release.conversation_id else None


_DEPTH = operator.attrgetter("depth")


def check_return_tier(runtime: PluginRuntime | None) -> None:
    """Refuse `LPCReturnCachePolicy` without the curves it is for: the GPU plugin registered
    in this engine with a return-time model (else every chunk would take the fallback score)."""
    access = runtime.access if runtime is not None else None
    if access is None or access.returns is None:
        raise PluginConfigError(
            "eviction_policy LPCReturnCachePolicy needs LPC in the engine (--scheduler-cls "
            "naming the LPC scheduler class) with a return-time model (return_model, "
            "LPC_RETURN_MODEL): each request's curve comes from LPC's release"
        )


def cache_policy_class(evictor: str) -> type[EvictorCachePolicy] | None:
    """The class that runs `evictor` as one of our vLLM CPU-tier policies
    (`CACHE_POLICY_EVICTORS`), without vLLM's base class: what those classes build on and
    what the two-tier replay runs itself (`lpc.replay.cache_policy_tier`). None when no
    policy of ours runs that evictor."""
    if evictor not in CACHE_POLICY_EVICTORS.values():
        return None
    if evictor == ReturnWindowEvictor.name:
        return ReturnEvictorCachePolicy
    return EvictorCachePolicy


def init_for_engine(policy: EvictorCachePolicy, cache_capacity: int, evictor: str) -> None:
    """What a vLLM class of ours does once vLLM's `CachePolicy.__init__` ran: vLLM builds it
    with the capacity only, so the GPU plugin's registration, when there is one in this
    process, gives it the counters, the finished requests' releases, the clock and the
    evictor's settings, and learns of it (its W is exported)."""
    base = cache_policy_class(evictor)
    assert base is not None and isinstance(policy, base), f"{evictor} is not {type(policy)}'s"
    runtime = registered_runtime()
    if base is ReturnEvictorCachePolicy:
        check_return_tier(runtime)
    base.__init__(
        policy,
        cache_capacity,
        evictor,
        clock=runtime.clock if runtime is not None else time.monotonic,
        stats=runtime.stats if runtime is not None else None,
        finished=runtime.finished if runtime is not None else None,
        trust=tier_trust(runtime),
        running=runtime.hints.get if runtime is not None else None,
        pinned_share=tier_pinned_share(runtime),
        **tier_evictor_options(evictor, runtime),
    )
    if runtime is not None:
        runtime.cpu_tier_policy = policy
