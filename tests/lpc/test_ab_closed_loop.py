"""`lpc ab --closed-loop` from the command line: each policy replays its own timeline."""

from __future__ import annotations

import json
from pathlib import Path

from lpc.cli.main import main

WORDS = ["cache", "block", "prefix", "token", "user", "reply", "think", "pause"]


def test_closed_loop_runs_and_estimates_the_scale_open_loop(tmp_path: Path, capsys) -> None:
    data = tmp_path / "chats.jsonl"
    with data.open("w") as handle:
        for c in range(60):
            messages = []
            for t in range(1 + c % 4):
                text = " ".join(WORDS[(c + t + i) % len(WORDS)] for i in range(60))
                messages += [
                    {"role": "user", "content": text},
                    {"role": "assistant", "content": text},
                ]
            handle.write(json.dumps({"id": f"chat{c}", "messages": messages}) + "\n")
    out = tmp_path / "o"
    args = ["ab", "--dataset", str(data), "--closed-loop", "--policies", "lru,lpc-turns"]
    args += ["--cache-sizes", "2000", "--duration", "300", "--max-active", "10", "--model"]
    code = main([*args, "none", "--no-progress", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    workload = json.loads((out / "results.json").read_text())["workload"]
    assert workload["closed_loop"] is True and workload["scale_per_s"] > 0
