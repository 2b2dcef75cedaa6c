"""The plugin's mode, switchable while the engine runs: the kill switch.

Three modes (`LPC_MODE`, default `lpc`):

    lpc      the free queue evicts by the learned order (the plugin's purpose)
    lru      the free queue evicts in stock vLLM's order, exactly (the kill switch)
    shadow   the engine evicts as in `lru`; the plugin replays the same requests through
             metadata-only LPC and LRU caches of the engine's size (`shadow`) and exports
             both hit ratios

A switch is asked for from any thread — the control file's watcher (`LPC_CONTROL_FILE`,
polled by a daemon thread, never by the scheduler), `vllm_plugin.set_mode()` — and only
recorded here (`ModeSwitch.set`). Each free queue applies it on the scheduler thread, at its
next pop, so no structure is touched by two threads: a pop compares one attribute.

Exact LRU order (`LRUOrder`). The learned evictor keeps running in `lru` mode: it sees every
release, hit and free, so switching back to `lpc` resumes the learned order with everything it
knows. Beside it, an LRU list holds the same free blocks in vLLM's order and decides what is
evicted; a block it hands out is discarded from the learned evictor. When the switch to LRU is
applied, the list is rebuilt from the learned evictor (`PriorityEvictor.lru_order`): blocks
without a hash first, in the order vLLM's queue keeps them (the same list), then cached blocks
by their latest release, oldest first, each release tail first. That is the order stock vLLM's
`FreeKVCacheBlockQueue` gives the same free blocks, since the relative order of a linked list's
entries depends only on when each was appended, not on which others left it. So after the
switch every eviction is the one stock vLLM would make from the same free blocks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eviction.base import FreedBlocks, Release
from eviction.lpc import LPCEvictor
from eviction.lru import LRUEvictor
from eviction.return_window import ReturnWindowEvictor

logger = logging.getLogger("vllm.plugins.lpc")

MODES = ("lpc", "lru", "shadow")
DEFAULT_MODE = "lpc"


def check_mode(value: object, what: str = "mode") -> str:
    """The mode named by `value` (case and surrounding blanks ignored), or ValueError."""
    mode = value.strip().lower() if isinstance(value, str) else value
    if mode not in MODES:
        raise ValueError(f"{what} must be one of {', '.join(MODES)}, got {value!r}")
    return mode  # type: ignore[return-value]


class ModeSwitch:
    """The mode the engine should run in, and how many times it changed.

    Written by any thread (a plain attribute store, atomic in CPython), read by the scheduler
    thread: `lru_order` is what a free queue compares at each pop.
    """

    def __init__(self, mode: str = DEFAULT_MODE) -> None:
        self.mode = check_mode(mode)
        self.lru_order = self.mode != "lpc"
        self.switches = 0
        self._lock = threading.Lock()

    def set(self, mode: str, source: str) -> bool:
        """Ask for `mode` (ValueError if it is none); True when it changed. Logged."""
        mode = check_mode(mode)
        with self._lock:
            old = self.mode
            if mode == old:
                return False
            self.mode = mode
            self.lru_order = mode != "lpc"
            self.switches += 1
        logger.warning("LPC mode switched from %s to %s (%s)", old, mode, source)
        return True

    def counters(self) -> dict[str, Any]:
        return {"mode": self.mode, "mode_switches": self.switches}


class ControlFileWatcher:
    """A daemon thread that reads a mode from a file every `poll_s` seconds.

    The file holds one word, `lpc`, `lru` or `shadow` (`echo lru > FILE` switches the engine
    to LRU). A changed content switches the mode; a missing or unchanged file changes nothing,
    so a mode set otherwise (`set_mode()`) stands until the file changes again. A content that
    names no mode is logged once and ignored. The scheduler thread never touches the file.
    """

    def __init__(self, path: str | Path, switch: ModeSwitch, poll_s: float = 1.0) -> None:
        # Refused here, not in the thread: a wait past threading's limit raises OverflowError
        # there, and a dead watcher would leave the kill switch deaf without a word.
        if (
            isinstance(poll_s, bool)
            or not isinstance(poll_s, int | float)
            or not 0 < poll_s <= threading.TIMEOUT_MAX
        ):
            raise ValueError(
                f"control file poll_s must be in (0, {threading.TIMEOUT_MAX:g}] seconds, "
                f"got {poll_s!r}"
            )
        self.path = Path(path)
        self.switch = switch
        self.poll_s = poll_s
        self._last: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> None:
        """Read the file and apply a changed mode (what the thread does every `poll_s`)."""
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError) as error:
            problem = f"<unreadable: {error}>"
            if self._last != problem:  # logged once per problem, not every poll
                self._last = problem
                logger.warning("LPC control file %s cannot be read: %s", self.path, error)
            return
        if text == self._last:
            return
        self._last = text
        try:
            mode = check_mode(text, f"the LPC control file {self.path}")
        except ValueError as error:
            logger.warning("%s; the mode stays %s", error, self.switch.mode)
            return
        self.switch.set(mode, f"control file {self.path}")

    def start(self) -> None:
        self.poll_once()  # a file present at start decides the mode before the first request
        self._thread = threading.Thread(target=self._run, name="lpc-control-file", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception as error:  # never let the watcher die silently
                logger.error("LPC control file watcher: %r", error)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


class LRUOrder:
    """The learned evictor's free blocks, handed out in stock vLLM's LRU order.

    Offers what `LPCFreeBlockQueue` calls on its evictor. Every release, hit and free reaches
    both structures; evictions come from the LRU list and are discarded from the learned
    evictor (`discard_n`), which therefore stays ready to take over again.
    """

    def __init__(self, learned: LPCEvictor | ReturnWindowEvictor, num_blocks: int) -> None:
        self.learned = learned
        self.lru = LRUEvictor(num_blocks)
        self.lru.reset(learned.lru_order())

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        try:
            self.learned.push_cached(freed, release)
        finally:  # the LRU list is vLLM's order whatever the learned evictor made of it
            self._append(freed.block_ids)

    def push_protected(self, freed: FreedBlocks, release: Release) -> None:
        """A preempted request's blocks: after every free block in the learned order, and
        appended (last) in LRU's, as stock vLLM appends them."""
        try:
            self.learned.push_protected(freed, release)
        finally:
            self._append(freed.block_ids)

    def note_protected_release(self, freed: FreedBlocks, release: Release) -> None:
        self.learned.note_protected_release(freed, release)

    def _append(self, block_ids: Sequence[int]) -> None:
        lru = self.lru
        # A retried append (the queue's fail-safe path) must not link a block twice.
        fresh = [b for b in block_ids if b not in lru]
        lru.append_n(fresh)

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        self.learned.push_uncached(block_ids)
        lru = self.lru
        lru.prepend_n([b for b in block_ids if b not in lru])

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        self.learned.note_shared_release(freed, release)

    def remove(self, block_id: int) -> None:
        self.learned.remove(block_id)  # KeyError for a block that is not free, as before
        self.lru.remove(block_id)

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        block_ids = self.lru.pop_n(n)
        self.learned.discard_n(block_ids)
        return block_ids

    def pop(self, now_s: float = 0.0) -> int:
        return self.pop_n(1)[0]

    def __len__(self) -> int:
        return len(self.lru)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self.learned

    def free_block_ids(self) -> list[int]:
        return self.lru.free_block_ids()

    def check_invariants(self) -> None:
        """Both structures hold the same free blocks (for tests)."""
        self.learned.check_invariants()
        self.lru.check_invariants()
        assert sorted(self.lru.free_block_ids()) == sorted(self.learned.free_block_ids()), (
            "LRU order: the LRU list and the learned evictor hold different free blocks"
        )
