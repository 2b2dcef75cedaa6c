"""Serve a request trace with vLLM 0.33.0's own scheduler: `lpc vllm-ab` (lpc/cli/vllm_ab.py).

Kept so that `.venv/bin/python scripts/vllm_scheduler_ab.py ARGS` still works from a checkout
without the `lpc` entry point; it is `lpc vllm-ab ARGS`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages

from lpc.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["vllm-ab", *sys.argv[1:]]))
