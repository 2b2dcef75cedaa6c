"""The plugin's mode, switchable while the engine runs: the kill switch.

Three modes (`LPC_MODE`, default `lpc`): `lpc` evicts by the learned order; `lru` hands the
pool vLLM's own queue once the learned blocks are evicted; `shadow` evicts as `lru` does while
the plugin replays the same requests through metadata-only LPC and LRU caches (`shadow`). A
switch is asked for from any thread (the control file's watcher, `vllm_plugin.set_mode()`)
and applied by that thread under this switch's lock, no block touched.

The design: docs/design.md, "The kill switch".
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger("vllm.plugins.lpc")

MODES = ("lpc", "lru", "shadow")
DEFAULT_MODE = "lpc"


def check_mode(value: object, what: str = "mode") -> str:
    """The mode named by `value` (case and surrounding blanks ignored), or ValueError."""
    mode = value.strip().lower() if isinstance(value, str) else value
    if mode not in MODES:
        raise ValueError(f"{what} must be one of {', '.join(MODES)}, got {value!r}")
    return mode  # type: ignore[return-value]


class FollowsMode(Protocol):
    """What takes the mode on: a free queue (`LPCFreeBlockQueue.follow`), or a scheduler's
    `schedule` (`scheduler_lpc.ScheduleFollower`)."""

    def follow(self, mode: str) -> None: ...


class ModeSwitch:
    """The mode the engine runs in, how many times it changed, and what follows it.

    `set` runs on the thread that asks (never the scheduler's): under `lock` it records the
    mode and has every follower (a free queue, a scheduler's step methods) take it on, O(1)
    each. A queue that changes its own class (the end of a drain, on the scheduler thread)
    takes the same lock, so a switch is never lost between the two threads.
    """

    def __init__(self, mode: str = DEFAULT_MODE) -> None:
        self.mode = check_mode(mode)
        self.lru_order = self.mode != "lpc"  # the queues evict in vLLM's LRU order
        self.switches = 0
        self.lock = threading.Lock()
        # Strong references: off in `lru`, vLLM's pool holds only vLLM's own queue object,
        # and this is what keeps the LPC queue (and the way back on) alive.
        self._followers: list[FollowsMode] = []

    @property
    def followers(self) -> tuple[FollowsMode, ...]:
        """What follows this switch, in the order it was attached."""
        return tuple(self._followers)

    def attach(self, follower: FollowsMode) -> None:
        """Have `follower` follow the mode from now on (it takes the current one at once)."""
        with self.lock:
            self._followers.append(follower)
            follower.follow(self.mode)

    def set(self, mode: str, source: str) -> bool:
        """Ask for `mode` (ValueError if it is none); True when it changed. Logged."""
        mode = check_mode(mode)
        with self.lock:
            old = self.mode
            if mode == old:
                return False
            self.mode = mode
            self.lru_order = mode != "lpc"
            self.switches += 1
            for follower in self._followers:
                try:
                    follower.follow(mode)
                except Exception as error:  # never leave the others behind
                    name = type(follower).__name__
                    logger.error("LPC: a %s could not follow mode %s: %r", name, mode, error)
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
