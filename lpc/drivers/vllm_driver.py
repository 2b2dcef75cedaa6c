"""Running scripts/vllm_plugin_replay.py in vLLM's venv from the project's venv.

vLLM's dependency pins clash with ours, so vLLM code only ever runs in its own venv
(scripts/setup_vllm_venv.sh), whose python is `LPC_VLLM_PYTHON` or `.vllm-venv/bin/python` in
the repository, as for the differential tests. Tests and scripts/vllm_trace_ab.py reach it
through a subprocess and read back `StepRecord`s.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lpc.difftest.ops import StepRecord, Stream, streams_to_jsonl
from lpc.drivers.release_plan import PluginSettings, ReleasePlan, write_plans

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout (scripts/ is not installed)
DRIVER = REPO_ROOT / "scripts" / "vllm_plugin_replay.py"
TIMEOUT_S = 1800


def vllm_python_path() -> Path:
    configured = os.environ.get("LPC_VLLM_PYTHON")
    return Path(configured) if configured else REPO_ROOT / ".vllm-venv" / "bin" / "python"


class DriverFailed(RuntimeError):
    """The vLLM driver exited with an error."""


@dataclass
class DriverRun:
    stock: dict[str, list[StepRecord]]
    plugin: dict[str, list[StepRecord]]
    summary: dict[str, Any]
    wall_seconds: float


def _records(path: Path) -> dict[str, list[StepRecord]]:
    out: dict[str, list[StepRecord]] = {}
    if not path.exists():
        return out
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            record = StepRecord.from_json(line)
            out.setdefault(record.stream, []).append(record)
    return out


def run_driver(
    python: Path,
    streams: Sequence[Stream],
    plans: Mapping[str, ReleasePlan],
    workdir: Path,
    settings: PluginSettings | None = None,
    stock: bool = True,
    plugin: bool = True,
    extra_args: Sequence[str] = (),
    timeout_s: float = TIMEOUT_S,
) -> DriverRun:
    """Replay `streams` on vLLM stock and/or with the plugin, in one driver process."""
    source, plan_file = workdir / "streams.jsonl", workdir / "plans.json"
    stock_out, plugin_out = workdir / "stock.jsonl", workdir / "plugin.jsonl"
    source.write_text(streams_to_jsonl(streams), encoding="utf-8")
    write_plans(plan_file, plans, settings if settings is not None else PluginSettings())
    command = [str(python), str(DRIVER), "--input", str(source), "--plans", str(plan_file)]
    if stock:
        command += ["--stock-output", str(stock_out)]
    if plugin:
        command += ["--plugin-output", str(plugin_out)]
    command += list(extra_args)
    start = time.perf_counter()
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
        check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-25:])
        raise DriverFailed(f"the vLLM plugin driver failed (exit {done.returncode}):\n{tail}")
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    return DriverRun(_records(stock_out), _records(plugin_out), summary, wall)
