"""Instructions executed, counted by valgrind's callgrind: a speed measure that load can't move.

Wall-clock nanoseconds on a shared machine vary by 2× between runs; callgrind counts the
instructions a program executes, the same on every run for the same binary and inputs. The
benchmark runs each replay process three ways (the replay; the loop alone; the loop with a
no-op call per operation, each after the same setup) and keeps the differences: the queue's
instructions with and without the calls that reach it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def valgrind_available() -> bool:
    return shutil.which("valgrind") is not None


def callgrind_instructions(argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Instructions `argv` executes under callgrind (its whole run), in `env` (default: ours).

    String hashing is seeded per process, and a large import (vLLM's pulls in torch) executes
    millions of instructions more or fewer with the seed; a fixed seed makes the modes of one
    replay, whose differences are the measure, run the same setup instruction for instruction.
    """
    completed = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        capture_output=True,
        text=True,
        check=False,
        env={**(os.environ if env is None else env), "PYTHONHASHSEED": "0"},
    )
    match = _COLLECTED.search(completed.stderr)
    if completed.returncode != 0 or match is None:
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"callgrind run failed ({completed.returncode}): {' | '.join(tail)}")
    return int(match.group(1))
