"""Check, in a fresh interpreter, that importing a module leaves heavy packages unloaded."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def assert_imports_light(module: str, heavy: Sequence[str]) -> None:
    """`import module` in a new process loads none of the top-level packages `heavy`."""
    code = (
        f"import sys, {module}; heavy = [m for m in sys.modules if m.split('.')[0] in "
        f"{tuple(heavy)!r}]; print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
