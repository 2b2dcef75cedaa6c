"""Running real vLLM's replay driver and collecting what the differential tests covered.

Shared by conftest.py (fixtures, terminal summary) and the test modules of this folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lpc.difftest.checks import ReplayTotals
from lpc.difftest.ops import StepRecord, Stream, streams_to_jsonl

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = REPO_ROOT / "scripts" / "vllm_replay.py"
DRIVER_TIMEOUT_S = 1800


class DriverFailed(RuntimeError):
    """The vLLM replay driver exited with an error."""


def vllm_python_path() -> Path:
    """`LPC_VLLM_PYTHON`, or the repository's .vllm-venv."""
    configured = os.environ.get("LPC_VLLM_PYTHON")
    return Path(configured) if configured else REPO_ROOT / ".vllm-venv" / "bin" / "python"


@dataclass(slots=True)
class VllmRun:
    """The records vLLM produced, per stream, and what the run cost."""

    records: dict[str, list[StepRecord]]
    vllm_version: str
    import_seconds: float
    seconds_per_stream: dict[str, float]
    wall_seconds: float


def run_vllm_replay(python: Path, streams: Sequence[Stream], workdir: Path) -> VllmRun:
    """Replay `streams` on real vLLM through scripts/vllm_replay.py, in one process."""
    source, sink = workdir / "streams.jsonl", workdir / "records.jsonl"
    source.write_text(streams_to_jsonl(streams), encoding="utf-8")
    start = time.perf_counter()
    done = subprocess.run(
        [str(python), str(DRIVER), "--input", str(source), "--output", str(sink)],
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
        cwd=REPO_ROOT,
        check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-25:])
        raise DriverFailed(f"the vLLM replay driver failed (exit {done.returncode}):\n{tail}")
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    records: dict[str, list[StepRecord]] = {s.config.name: [] for s in streams}
    with sink.open(encoding="utf-8") as lines:
        for line in lines:
            record = StepRecord.from_json(line)
            records[record.stream].append(record)
    return VllmRun(
        records,
        summary["vllm_version"],
        summary["import_seconds"],
        summary["seconds_per_stream"],
        wall,
    )


@dataclass(slots=True)
class CoverageReport:
    """What the differential tests compared, printed in pytest's terminal summary."""

    lines: list[str] = field(default_factory=list)
    totals: ReplayTotals = field(default_factory=ReplayTotals)
    seeds: int = 0
    steps: int = 0

    def as_dict(self) -> dict:
        """What a pytest-xdist worker hands back to the process that prints the summary."""
        return asdict(self)

    def merge(self, other: dict) -> None:
        """Add a worker's report (`as_dict`) to this one."""
        self.lines.extend(other["lines"])
        self.totals.add(ReplayTotals(**other["totals"]))
        self.seeds += other["seeds"]
        self.steps = max(self.steps, other["steps"])


REPORT = CoverageReport()
