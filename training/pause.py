"""Named pause points, so tests can kill a real process at a chosen step.

The atomicity tests start `lpc retrain` in a subprocess with `LPC_PAUSE_AT=<point>` and
`LPC_PAUSE_FILE=<path>`: on reaching that point the process writes the path (so the test
knows where it is) and sleeps until it is killed with SIGKILL. Without the variables a pause
point does nothing but compare one string.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_AT_ENV = "LPC_PAUSE_AT"
PAUSE_FILE_ENV = "LPC_PAUSE_FILE"


def pause_point(name: str) -> None:
    if os.environ.get(PAUSE_AT_ENV) != name:
        return
    marker = os.environ.get(PAUSE_FILE_ENV)
    if marker:
        Path(marker).write_text(f"{name} {os.getpid()}\n", encoding="utf-8")
    while True:  # until killed
        time.sleep(3600)
