"""Evict the block whose conversation is least likely to come back while the cache holds it.

`lpc-return` ranks a cached block by P(next request within W | silent for a) =
(S(a) − S(a + W)) / S(a), S the releasing conversation's return-time survival curve and W a
multiple of the evictor's own measured holding time. Pooling over conversations' claims, a
shared floor, an optional claim memory, periodic re-keying, ties and protected releases are
all here.

The rules, the approximation and how each constant was chosen: docs/design.md, "The
return-time evictor (`eviction/return_window.py`)".
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from typing import ClassVar

from eviction.base import FreedBlocks, Release, ReturnCurveLike, check_probability
from eviction.lpc_pooled import DEFAULT_MEMORY_BLOCKS_FACTOR, SHARED_PRIOR
from eviction.priority import PriorityEvictor
from eviction.run_heap import Ghost, Run

DEFAULT_REKEY_INTERVAL_S = 5.0
DEFAULT_INITIAL_WINDOW_S = 60.0
DEFAULT_WINDOW_WEIGHT = 1.0 / 256.0  # per evicted block (the eviction-age rule)
DEFAULT_TURNOVER_WEIGHT = 1.0 / 16.0  # per re-keying interval (the turnover rule)
DEFAULT_WINDOW_RULE = "turnover"
# W = 4 × the turnover: blocks the policy keeps stay far longer than the mean block, which
# the ones it scores 0 pull down (docs/results.md, "An evictor that asks when: P(return
# within W | silent a)").
DEFAULT_WINDOW_MULTIPLIER = 4.0
DEFAULT_MAX_CLAIMS = 4
DEFAULT_FALLBACK_SCORE = 0.5
# A block two or more conversations claim scores at least this (docs/results.md, "A shared
# floor and ties by age").
DEFAULT_SHARED_FLOOR = 0.25
# Equal scores go older release first (docs/results.md, "A shared floor and ties by age").
DEFAULT_TIES = "age"
# `shared_floor` value for the floor estimated online (`SharedReuse`).
SHARED_FLOOR_ONLINE = "online"
# A protected claim scores this plus its release time (times before 0 count as 0): above
# every probability, and a later protection above an earlier one.
PROTECTED_SCORE = 2.0


class Claim:
    """One conversation's say on a block: its return curve and when it released the block;
    `protected_score` set for a preempted request's release (its fixed score). Compared by
    identity (runs group blocks whose claims are the same objects)."""

    __slots__ = ("conversation_id", "curve", "protected_score", "release_s")

    def __init__(
        self,
        conversation_id: str | None,
        curve: ReturnCurveLike | None,
        release_s: float,
        protected_score: float | None = None,
    ) -> None:
        self.conversation_id = conversation_id
        self.curve = curve
        self.release_s = release_s
        self.protected_score = protected_score

    @classmethod
    def protected(cls, conversation_id: str | None, release_s: float) -> Claim:
        """A preempted request's claim: it scores above every probability (the module)."""
        return cls(conversation_id, None, release_s, PROTECTED_SCORE + max(0.0, release_s))


class _SmoothedWindow:
    """W, exponentially smoothed: each observation moves it by `weight` of the difference."""

    def __init__(self, initial_s: float, weight: float) -> None:
        if not math.isfinite(initial_s) or initial_s <= 0:
            raise ValueError(f"initial_s must be a finite number > 0, got {initial_s!r}")
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"weight must be in (0, 1], got {weight!r}")
        self.value_s = initial_s
        self.weight = weight
        self.observed = 0

    def _move_towards(self, target_s: float) -> None:
        self.value_s += self.weight * (target_s - self.value_s)
        self.observed += 1


class EvictionAgeEstimate(_SmoothedWindow):
    """W: an exponentially weighted mean of eviction ages, one update per evicted block.

    Starts at `initial_s` (no eviction seen yet); each evicted cached block's age moves it by
    `weight` of the difference, so it follows the cache's own holding time within about
    1/weight evictions and needs no cache size.
    """

    def __init__(
        self,
        initial_s: float = DEFAULT_INITIAL_WINDOW_S,
        weight: float = DEFAULT_WINDOW_WEIGHT,
    ) -> None:
        super().__init__(initial_s, weight)

    def observe(self, age_s: float) -> None:
        if age_s < 0 or not math.isfinite(age_s):
            return
        # Inline (once per evicted block): the update of `_move_towards`.
        self.value_s += self.weight * (age_s - self.value_s)
        self.observed += 1


class TurnoverEstimate(_SmoothedWindow):
    """W by Little's law: the cached blocks queued, divided by the rate at which cached blocks
    are evicted — the mean time a block spends in this cache's free queue.

    The mean eviction age of `EvictionAgeEstimate` is pulled down by this very policy: blocks
    it scores 0 go within seconds, so their ages say little about how long a block it wants
    to keep would last, and a shorter W scores more blocks 0 (a loop towards W = 0). Little's
    law counts every queued block, the kept ones included. One observation per re-keying
    interval (queued blocks at its end, its length, cached evictions in it), smoothed with
    `weight`; an interval without evictions leaves W as it is (nothing is under pressure).
    """

    def __init__(
        self,
        initial_s: float = DEFAULT_INITIAL_WINDOW_S,
        weight: float = DEFAULT_TURNOVER_WEIGHT,
    ) -> None:
        super().__init__(initial_s, weight)

    def observe_interval(self, queued: int, elapsed_s: float, evicted: int) -> None:
        if evicted <= 0 or not elapsed_s > 0 or not math.isfinite(elapsed_s):
            return
        self._move_towards(queued * elapsed_s / evicted)


class _Judged:
    """One shared release of a content, to be judged: its deadline (release time + W) and
    the time of the content's next release (None until one comes)."""

    __slots__ = ("content", "deadline_s", "next_s")

    def __init__(self, content: Hashable, deadline_s: float) -> None:
        self.content = content
        self.deadline_s = deadline_s
        self.next_s: float | None = None


class SharedReuse:
    """The online shared floor: the share of shared releases whose content was released again
    within the W in force at that release.

    Each shared release of a content (with a hash) waits in a heap by its deadline; the
    content's next release, by any conversation, is noted on the newest waiting one; a release
    at time t first judges every waiting release whose deadline is before t (every release up
    to its deadline has been seen by then, if releases come in time order). One pseudo-release
    at 0.5 (`lpc-pooled`'s prior) before any is judged.
    """

    def __init__(self) -> None:
        self.judged = 0
        self.reused = 0
        self._due: list[tuple[float, int, _Judged]] = []
        self._newest: dict[Hashable, _Judged] = {}
        self._seq = 0

    @property
    def value(self) -> float:
        """The floor now."""
        return (self.reused + SHARED_PRIOR) / (self.judged + 1)

    def waiting(self) -> int:
        """Shared releases not judged yet."""
        return len(self._due)

    def observe(
        self,
        now_s: float,
        hashes: Sequence[Hashable | None],
        claims: Sequence[Sequence[Claim]],
        window_s: float,
    ) -> None:
        """One release: judge what is due, note each content's release, and wait on each block
        the release leaves shared."""
        due, newest = self._due, self._newest
        while due and due[0][0] < now_s:
            _, _, judged = heapq.heappop(due)
            self.judged += 1
            if judged.next_s is not None and judged.next_s <= judged.deadline_s:
                self.reused += 1
            elif newest.get(judged.content) is judged:
                del newest[judged.content]  # no release noted yet: nothing more to note
        deadline = now_s + window_s
        for block_hash, held in zip(hashes, claims, strict=True):
            if block_hash is None:
                continue
            last = newest.pop(block_hash, None)
            if last is not None and last.next_s is None:
                last.next_s = now_s
            if is_shared(held):
                record = _Judged(block_hash, deadline)
                newest[block_hash] = record
                self._seq += 1
                heapq.heappush(due, (deadline, self._seq, record))

    def clear(self) -> None:
        self.judged = self.reused = 0
        self._due.clear()
        self._newest.clear()


WINDOW_RULES = ("turnover", "eviction-age")
POOLINGS = ("max", "or")
TIES = ("depth", "age")


def is_shared(claims: Sequence[Claim]) -> bool:
    """Whether the claims come from two or more named conversations."""
    first = None
    for claim in claims:
        cid = claim.conversation_id
        if cid is None:
            continue
        if first is None:
            first = cid
        elif cid != first:
            return True
    return False


def pooled_score(scores: Sequence[float], pooling: str) -> float:
    """The block's score from its claims' scores: the largest, or (`or`) 1 − ∏(1 − p); a
    protected claim's score (above 1) wins either way. Claims scoring 0 are left out of the
    product and one claim left is its own score, so that blocks whose pooled chances are
    equal get equal keys (1 − (1 − p) need not be p in floating point) and ties break by
    depth and age (docs/design.md, "The return-time evictor")."""
    best = max(scores)
    if pooling == "max" or best > 1.0:
        return best
    keep, count = 1.0, 0
    for p in scores:
        if p > 0.0:
            keep *= 1.0 - p
            count += 1
    return best if count <= 1 else 1.0 - keep


def claim_score(claim: Claim, now_s: float, window_s: float, fallback: float) -> float:
    """P(return within W | silent since the claim's release); `fallback` without a curve or
    when the curve's answer is not in [0, 1] (NaN included: it would break the heap's order);
    a protected claim's fixed score."""
    protected = claim.protected_score
    if protected is not None:
        return protected
    curve = claim.curve
    if curve is None:
        return fallback
    p = curve.p_return_within(max(0.0, now_s - claim.release_s), window_s)
    return p if 0.0 <= p <= 1.0 else fallback


class ReturnWindowEvictor(PriorityEvictor):
    """A run heap keyed by P(return within W | silent a), re-keyed on a schedule."""

    name: ClassVar[str] = "lpc-return"

    def __init__(
        self,
        num_blocks: int,
        rekey_interval_s: float = DEFAULT_REKEY_INTERVAL_S,
        initial_window_s: float = DEFAULT_INITIAL_WINDOW_S,
        window_weight: float = DEFAULT_WINDOW_WEIGHT,
        max_claims: int = DEFAULT_MAX_CLAIMS,
        fallback_score: float = DEFAULT_FALLBACK_SCORE,
        window_rule: str = DEFAULT_WINDOW_RULE,
        turnover_weight: float = DEFAULT_TURNOVER_WEIGHT,
        window_multiplier: float = DEFAULT_WINDOW_MULTIPLIER,
        pooling: str = "max",
        shared_floor: float | str | None = DEFAULT_SHARED_FLOOR,
        ties: str = DEFAULT_TIES,
        claim_memory_s: float | None = None,
        memory_blocks_factor: float = DEFAULT_MEMORY_BLOCKS_FACTOR,
    ) -> None:
        if not rekey_interval_s >= 0 or math.isnan(rekey_interval_s):
            raise ValueError(f"rekey_interval_s must be >= 0, got {rekey_interval_s!r}")
        if max_claims < 1:
            raise ValueError(f"max_claims must be >= 1, got {max_claims!r}")
        check_probability(fallback_score, "fallback_score")
        self.rekey_interval_s = rekey_interval_s
        if window_rule not in WINDOW_RULES:
            raise ValueError(f"window_rule must be one of {WINDOW_RULES}, got {window_rule!r}")
        if not math.isfinite(window_multiplier) or window_multiplier <= 0:
            raise ValueError(f"window_multiplier must be > 0, got {window_multiplier!r}")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if isinstance(shared_floor, str):
            if shared_floor != SHARED_FLOOR_ONLINE:
                raise ValueError(
                    f"shared_floor must be a probability, {SHARED_FLOOR_ONLINE!r} or None, "
                    f"got {shared_floor!r}"
                )
        elif shared_floor is not None:
            check_probability(shared_floor, "shared_floor")
        if ties not in TIES:
            raise ValueError(f"ties must be one of {TIES}, got {ties!r}")
        if claim_memory_s is not None and (
            not math.isfinite(claim_memory_s) or claim_memory_s <= 0
        ):
            raise ValueError(
                f"claim_memory_s must be a finite number > 0 or None, got {claim_memory_s!r}"
            )
        if not math.isfinite(memory_blocks_factor) or memory_blocks_factor <= 0:
            raise ValueError(
                f"memory_blocks_factor must be a finite number > 0, got {memory_blocks_factor!r}"
            )
        self.claim_memory_s = claim_memory_s
        self.memory_max_entries = max(1, int(memory_blocks_factor * num_blocks))
        # content hash -> (time of its last release, the claims its block held after it);
        # oldest release first. None: no memory.
        self._memory: OrderedDict[Hashable, tuple[float, tuple[Claim, ...]]] | None = (
            None if claim_memory_s is None else OrderedDict()
        )
        self.age_ties = ties == "age"
        self.pooling = pooling
        self.shared_floor = shared_floor
        # The online floor's estimate (None: the floor is a constant or off).
        self.shared_reuse: SharedReuse | None = (
            SharedReuse() if shared_floor == SHARED_FLOOR_ONLINE else None
        )
        self.window_rule = window_rule
        self.window_multiplier = window_multiplier
        self.window: EvictionAgeEstimate | TurnoverEstimate = (
            TurnoverEstimate(initial_window_s, turnover_weight)
            if window_rule == "turnover"
            else EvictionAgeEstimate(initial_window_s, window_weight)
        )
        self._evicted_since_rekey = 0
        self._window_since_s = -math.inf
        self.max_claims = max_claims
        self.fallback_score = fallback_score
        self.rekeys = 0
        self._last_rekey_s = -math.inf
        self._released_at: list[float] = [math.nan] * num_blocks
        super().__init__(num_blocks)

    # -- keys ------------------------------------------------------------------------------

    @property
    def window_s(self) -> float:
        """W: the measured estimate times `window_multiplier` (1: the estimate itself)."""
        return self.window.value_s * self.window_multiplier

    def score(self, claims: Sequence[Claim], now_s: float) -> float:
        """The block's score now: its claims' P(return within W | silent a), pooled, and at
        least the shared floor when two or more conversations claim it."""
        w, fallback = self.window_s, self.fallback_score
        if len(claims) == 1:
            return claim_score(claims[0], now_s, w, fallback)
        if self.pooling == "max":
            best = max(claim_score(c, now_s, w, fallback) for c in claims)
        else:
            best = pooled_score([claim_score(c, now_s, w, fallback) for c in claims], "or")
        floor = self.floor
        if floor is not None and best < floor and is_shared(claims):
            return floor
        return best

    @property
    def floor(self) -> float | None:
        """The shared floor now: the constant, the online estimate, or None (off)."""
        reuse = self.shared_reuse
        return self.shared_floor if reuse is None else reuse.value  # type: ignore[return-value]

    def key(self, claims: Sequence[Claim], now_s: float) -> float | tuple[float, float]:
        """The heap key: the score, and with `ties="age"` the newest claim's release time
        after it (equal scores: the older release first)."""
        score = self.score(claims, now_s)
        if self.age_ties:
            return (score, max(c.release_s for c in claims))
        return score

    def _claims_after(
        self, block_id: int, claim: Claim, block_hash: Hashable | None = None
    ) -> tuple[Claim, ...]:
        """The block's claims once `claim` joins them (max_claims newest, one per
        conversation; an anonymous release replaces nothing). A block that holds no claims
        and was evicted since its last release (or never released) starts from its content's
        remembered claims, with a claim memory."""
        old = self._state[block_id]
        if old is not None:
            held: Sequence[Claim] = old.tag
        elif (
            block_hash is not None
            and self._memory is not None
            and math.isnan(self._released_at[block_id])
        ):
            held = self._remembered(block_hash, claim.release_s)
        else:
            return (claim,)
        cid = claim.conversation_id
        others = [c for c in held if cid is None or c.conversation_id != cid]
        if not others:
            return (claim,)
        return (claim, *others[: self.max_claims - 1])

    def _remembered(self, block_hash: Hashable, now_s: float) -> Sequence[Claim]:
        """The claims the memory holds for a content, those released within it and not
        protected."""
        entry = self._memory.get(block_hash)  # type: ignore[union-attr]
        if entry is None:
            return ()
        cutoff = now_s - self.claim_memory_s  # type: ignore[operator]
        return [c for c in entry[1] if c.protected_score is None and c.release_s >= cutoff]

    def _expire_memory(self, now_s: float) -> None:
        """Forget the contents last released before the memory's window."""
        memory = self._memory
        cutoff = now_s - self.claim_memory_s  # type: ignore[operator]
        while memory:
            oldest = next(iter(memory))
            if memory[oldest][0] >= cutoff:
                break
            del memory[oldest]

    def _record(
        self, hashes: Sequence[Hashable | None], claims: Sequence[tuple[Claim, ...]], now_s: float
    ) -> None:
        """Remember each content's claims after this release, newest last; then bound the
        memory's size, oldest first."""
        memory = self._memory
        for block_hash, held in zip(hashes, claims, strict=True):
            if block_hash is not None:
                memory.pop(block_hash, None)  # type: ignore[union-attr]
                memory[block_hash] = (now_s, held)  # type: ignore[index]
        for _ in range(len(memory) - self.memory_max_entries):  # type: ignore[arg-type]
            memory.popitem(last=False)  # type: ignore[union-attr]

    def _claims_of(self, freed: FreedBlocks, claim: Claim) -> list[tuple[Claim, ...]]:
        """Every block's claims once `claim` joins them; with a claim memory, recorded there
        (call before the blocks' release times are set); with the online floor, observed."""
        block_ids = freed.block_ids
        if self._memory is None:
            claims = [self._claims_after(b, claim) for b in block_ids]
        else:
            now = claim.release_s
            self._expire_memory(now)
            hashes = freed.hashes
            claims = [
                self._claims_after(b, claim, h) for b, h in zip(block_ids, hashes, strict=True)
            ]
            self._record(hashes, claims, now)
        if self.shared_reuse is not None:
            self.shared_reuse.observe(claim.release_s, freed.hashes, claims, self.window_s)
        return claims

    def memory_size(self) -> int:
        """Contents the claim memory holds now (0 without one)."""
        return 0 if self._memory is None else len(self._memory)

    def reset(self, block_ids: Iterable[int]) -> None:
        super().reset(block_ids)
        if self._memory is not None:
            self._memory.clear()
        if self.shared_reuse is not None:
            self.shared_reuse.clear()

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        self._push(freed, Claim(release.conversation_id, release.return_curve, release.time_s))

    def push_protected(self, freed: FreedBlocks, release: Release) -> None:
        """Queue the blocks of a request that is not finished (preempted): after every block
        queued so far until it takes them back (the module). Its curve is not used."""
        self._push(freed, Claim.protected(release.conversation_id, release.time_s))

    def _push(self, freed: FreedBlocks, claim: Claim) -> None:
        block_ids = freed.block_ids
        if not block_ids:
            return
        now = claim.release_s
        released_at = self._released_at
        if self.shared_reuse is not None or (
            self._memory is not None and freed.hashes.count(None) != len(freed.hashes)
        ):
            claims = self._claims_of(freed, claim)
            for block_id in block_ids:
                released_at[block_id] = now
            keys = self._keys(claims, now)
            self._push_grouped(block_ids, freed.depths, keys, claims)
            return
        for block_id in block_ids:
            released_at[block_id] = now
        # Fast path, one pass and no allocation per block (a 128K-token request frees 8,192):
        # blocks new to the cache, or claimed only by this conversation, keep this claim alone
        # (`_claims_after`: one claim per conversation) and form a single run.
        state, cid = self._state, claim.conversation_id
        for block_id in block_ids:
            old = state[block_id]
            if old is not None and (
                cid is None or len(old.tag) != 1 or old.tag[0].conversation_id != cid
            ):
                break
        else:
            own = (claim,)
            self._push_run(self.key(own, now), own, block_ids, freed.depths)
            return
        claims = [self._claims_after(b, claim) for b in block_ids]
        keys = [self.key(c, now) for c in claims]
        self._push_grouped(block_ids, freed.depths, keys, claims)

    def _keys(self, claims: Sequence[tuple[Claim, ...]], now_s: float) -> list:
        """`key` of each block's claims; blocks holding the same claims share one."""
        keys = []
        last_claims: tuple[Claim, ...] | None = None
        last_key = None
        for held in claims:
            if held != last_claims:
                last_claims, last_key = held, self.key(held, now_s)
            keys.append(last_key)
        return keys

    def push_cached_each(self, freed: FreedBlocks, release: Release) -> None:
        """`push_cached` of each block alone, in the given order (any depths), all with the
        same release, in one call (vLLM's CPU tier hands chunks over one at a time and
        pushes them in batches, `lpc.integrations.vllm_cache_policy`). The same keys and
        eviction order as the single pushes: a block's claims and score depend only on the
        release and the block's own claims, W changes only at a re-keying, and the blocks
        are queued deepest first as runs in list order (`_push_deepest_first`)."""
        claim = Claim(release.conversation_id, release.return_curve, release.time_s)
        self._push_each(freed, claim)

    def push_protected_each(self, freed: FreedBlocks, release: Release) -> None:
        """`push_protected` of each block alone, in the given order, in one call (as
        `push_cached_each`)."""
        self._push_each(freed, Claim.protected(release.conversation_id, release.time_s))

    def _push_each(self, freed: FreedBlocks, claim: Claim) -> None:
        block_ids = freed.block_ids
        if len(block_ids) <= 1:
            self._push(freed, claim)
            return
        now = claim.release_s
        claims = self._claims_of(freed, claim)
        released_at = self._released_at
        for block_id in block_ids:
            released_at[block_id] = now
        self._push_deepest_first(freed, self._keys(claims, now), claims)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        claim = Claim(release.conversation_id, release.return_curve, release.time_s)
        self._remember_claim(freed, claim)

    def note_protected_release(self, freed: FreedBlocks, release: Release) -> None:
        """`push_protected` for cached blocks the preempted request gives up while other
        requests still hold them: their claims take its protected claim."""
        self._remember_claim(freed, Claim.protected(release.conversation_id, release.time_s))

    def _remember_claim(self, freed: FreedBlocks, claim: Claim) -> None:
        """Add `claim` to the claims of blocks that are in use (not queued)."""
        for block_id, claims in zip(freed.block_ids, self._claims_of(freed, claim), strict=True):
            self._state[block_id] = Ghost(self.key(claims, claim.release_s), claims)

    def drop_claim(self, block_id: int, conversation_id: str | None) -> None:
        """Forget `conversation_id`'s claim on a block that is not queued (vLLM's CPU tier: a
        claim a request made under its own id before its conversation was known, which its
        final release would otherwise pool with). No claim left: the block starts afresh."""
        slot = self._state[block_id]
        if type(slot) is Run:
            raise ValueError(f"block {block_id} is queued; remove it first")
        if slot is None or conversation_id is None:
            return
        claims = tuple(c for c in slot.tag if c.conversation_id != conversation_id)
        self._state[block_id] = Ghost(slot.key, claims) if claims else None

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        released_at = self._released_at
        for block_id in block_ids:
            released_at[block_id] = math.nan
        super().push_uncached(block_ids)

    def rekey(self, now_s: float) -> None:
        """Update W (turnover rule), score every queued run at `now_s` with it and rebuild
        the heap."""
        window = self.window
        elapsed = now_s - self._window_since_s
        if elapsed > 0 or self._window_since_s == -math.inf:
            if isinstance(window, TurnoverEstimate):
                window.observe_interval(self._queued, elapsed, self._evicted_since_rekey)
            self._evicted_since_rekey = 0
            self._window_since_s = now_s
        w, fallback = self.window_s, self.fallback_score
        or_pooling = self.pooling == "or"
        floor = self.floor
        age_ties = self.age_ties
        cache: dict[int, float] = {}
        heap = []
        for _, _, seq, run in self._heap:
            i = self._head(run)
            if i >= len(run.block_ids):
                continue
            best = -1.0
            for claim in run.tag:
                p = cache.get(id(claim))
                if p is None:
                    p = cache[id(claim)] = claim_score(claim, now_s, w, fallback)
                if p > best:
                    best = p
            if or_pooling and len(run.tag) > 1 and best <= 1.0:
                best = pooled_score([cache[id(c)] for c in run.tag], "or")
            if floor is not None and best < floor and len(run.tag) > 1 and is_shared(run.tag):
                best = floor
            key = (best, max(c.release_s for c in run.tag)) if age_ties else best
            run.key = key
            if run.ghost is not None:
                run.ghost.key = key
            heap.append((key, -run.depths[i], seq, run))
        heapq.heapify(heap)
        self._heap = heap
        self._last_rekey_s = now_s
        self.rekeys += 1

    # -- evictions -------------------------------------------------------------------------

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        from_uncached = self._uncached.size
        if n > from_uncached and now_s - self._last_rekey_s >= self.rekey_interval_s:
            self.rekey(now_s)
        out = super().pop_n(n, now_s)
        released_at, window = self._released_at, self.window
        victims = out[from_uncached:]
        self._evicted_since_rekey += len(victims)
        if isinstance(window, EvictionAgeEstimate):
            for block_id in victims:
                window.observe(now_s - released_at[block_id])
        for block_id in victims:
            released_at[block_id] = math.nan
        return out

    def discard_n(self, block_ids: Sequence[int]) -> None:
        """Blocks another order handed out (the serving plugin's LRU mode): evictions of this
        cache all the same, so the cached ones count towards the turnover as `pop_n`'s do
        (no time comes with them, so the eviction-age rule observes none)."""
        super().discard_n(block_ids)
        released_at = self._released_at
        for block_id in block_ids:
            if not math.isnan(released_at[block_id]):
                self._evicted_since_rekey += 1
                released_at[block_id] = math.nan

    def check_invariants(self) -> None:
        super().check_invariants()
        for _, _, _, run in self._heap:
            assert isinstance(run, Run) and run.tag, "lpc-return: a queued run has no claims"
            assert len(run.tag) <= self.max_claims, "lpc-return: a run holds too many claims"
