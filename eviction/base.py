"""The evictor interface: the block manager's free blocks, kept in eviction order.

A block manager hands every free block of its pool to an evictor and asks it which block to
hand out next. Blocks that hold no cached prefix are always reused before any cached block
(reusing them loses nothing); the policies differ only in how they order cached blocks.
"""

from __future__ import annotations

import copy
import math
import pickle
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol


class ReturnCurveLike(Protocol):
    """What an evictor asks of a return-time model: P(next request within `window_s` | no
    request for `silent_s` since this release). `predictor.return_curve.ReturnCurve` answers
    it; the evictors name only the question, so this package depends on nothing of ours."""

    def p_return_within(self, silent_s: float, window_s: float) -> float: ...


@dataclass(frozen=True, slots=True)
class Release:
    """What the block manager knows when a request releases its blocks.

    `probability` is the predicted chance that the releasing conversation continues (None when
    no prediction arrived in time: the evictor then uses its fallback). `conversation_id` lets
    an evictor tell a block shared by several conversations from one released again by its
    only conversation. `category` is the request's workload category as the frontend tags it
    (request type × turn, e.g. "chat_1"; None when untagged): workload-aware eviction (`wa`)
    keeps one queue per category. The block manager hands one release over in up to two calls
    (`push_cached`, then `note_shared_release`) with the same object, so a policy that treats a
    request's whole chain as one event may recognise the second call by identity.
    `return_curve` is the releasing conversation's return-time curve, for
    evictors that ask when it comes back (None: no curve; the other policies ignore it).
    """

    time_s: float
    probability: float | None = None
    conversation_id: str | None = None
    category: str | None = None
    return_curve: ReturnCurveLike | None = None


@dataclass(frozen=True, slots=True)
class FreedBlocks:
    """Cached blocks released together by one request, in the order they were freed.

    Parallel lists (one record per release, not per block, keeps the hot path cheap):
    `depths[i]` is block i's index in its sequence (0 = the first block of the prompt) and
    `hashes[i]` identifies its content, for policies that look at the future of a trace.
    `chain=True` says the blocks are one sequence's contiguous tail, tail first, so block i's
    parent is block i + 1 (a request's free: the block manager's, the engine's); then
    `parent_id` is the block that holds the shallowest one's parent (still in use by other
    requests; None when the blocks start the sequence or the caller does not know it). A
    prefix-closed evictor links them to know which blocks are leaves; other callers (a CPU
    tier's resident chunks, which may skip depths) leave `chain` False.
    """

    block_ids: Sequence[int]
    depths: Sequence[int]
    hashes: Sequence[bytes | None]
    parent_id: int | None = None
    chain: bool = False
    # The block ids as a numpy array of intp, when the caller built one (the vLLM queue, for
    # its own per-block arrays): the heap's position scatter reuses it. None: built if needed.
    index: Any = field(default=None, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.block_ids)


def check_probability(value: float | None, what: str = "probability") -> None:
    """Raise ValueError unless `value` is None or a finite number in [0, 1]."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number in [0, 1], got {type(value).__name__} {value!r}")
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be in [0, 1], got {value!r}")


def dry_run_copy(evictor: object, keep: str = "_uncached") -> object:
    """A copy of `evictor` whose state, all but the attribute `keep` (shared, not copied), is
    its own: a dry run of evictions on it leaves the original untouched. For the policies
    whose pop order is only known by evicting (queues that promote, sessions that expire):
    their `free_block_ids` pops this copy. A pickle round trip copies the plain lists, dicts
    and slotted records those policies hold several times faster than `copy.deepcopy` (their
    invariant tests call it at every step)."""
    dry = copy.copy(evictor)
    state = {k: v for k, v in evictor.__dict__.items() if k != keep}
    dry.__dict__.update(pickle.loads(pickle.dumps(state, pickle.HIGHEST_PROTOCOL)))
    return dry


class Evictor(ABC):
    """Free blocks of one pool, in the order they will be handed out.

    Contract with the block manager:
    - `reset(ids)` once: every block starts free and uncached, reused in the given order;
    - `push_uncached(ids)`: blocks with no cached hash were freed; they go to the front and are
      reused first, in the given order (vLLM's LIFO reuse of non-cached blocks);
    - `push_cached(freed, release)`: cached blocks whose reference count reached 0, in the
      order the manager frees them (the tail of a sequence first);
    - `note_shared_release(freed, release)`: a release of cached blocks that other requests
      still hold; policies that pool metadata across conversations record it;
    - `remove(id)`: a free cached block was hit and is in use again;
    - `pop_n(n, now)`: the next n blocks to reuse; a popped cached block loses its content, so
      the evictor forgets everything it knew about it.
    """

    name: ClassVar[str] = "base"
    # True when the policy never evicts a cached block while a cached descendant of it (in
    # its hash chain) stays: a block whose parent is gone can never be hit again, so keeping
    # it wastes its space. The block manager then checks that no cached block is an orphan.
    prefix_closed: ClassVar[bool] = False

    @abstractmethod
    def reset(self, block_ids: Iterable[int]) -> None: ...

    @abstractmethod
    def push_uncached(self, block_ids: Sequence[int]) -> None: ...

    @abstractmethod
    def push_cached(self, freed: FreedBlocks, release: Release) -> None: ...

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        """Record a release of blocks other requests still use (default: nothing to record)."""
        return None

    @abstractmethod
    def remove(self, block_id: int) -> None: ...

    @abstractmethod
    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]: ...

    def pop(self, now_s: float = 0.0) -> int:
        """The single next block to reuse."""
        return self.pop_n(1, now_s)[0]

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __contains__(self, block_id: object) -> bool: ...

    @abstractmethod
    def free_block_ids(self) -> list[int]:
        """All free blocks in eviction order (for tests and debugging; not a hot path)."""

    def check_invariants(self) -> None:
        """Assert the evictor's internal consistency (for tests; O(n) or more).

        The base checks what every policy owes the block manager: the eviction order lists
        each free block once, agrees with `len` and with membership. Policies with their own
        structures extend it with the rules those structures rest on.
        """
        order = self.free_block_ids()
        assert len(order) == len(set(order)), f"{self.name}: a block is listed free twice"
        assert len(order) == len(self), (
            f"{self.name}: len() is {len(self)} but {len(order)} blocks are listed free"
        )
        for block_id in order:
            assert block_id in self, f"{self.name}: free block {block_id} fails membership"


class FreeFlags:
    """`len` and `in` for an evictor that keeps a free flag per block (`_free`), their count
    (`_num_free`) and the uncached blocks' list (`_uncached`). Listed before `Evictor`."""

    _free: Any
    _num_free: int
    _num_blocks: int
    _uncached: Any

    def __len__(self) -> int:
        return self._uncached.size + self._num_free

    def __contains__(self, block_id: object) -> bool:
        if not isinstance(block_id, int) or not 0 <= block_id < self._num_blocks:
            return False
        # `in self._uncached` past the checks just made
        return self._free[block_id] or self._uncached._nodes[block_id].prev is not None
