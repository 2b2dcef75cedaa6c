"""scripts/sglang_trace_ab.py on a small trace, through SGLang's real radix caches (`sglang`).

With a cache that never fills, SGLang's token-granular tree (page size 1) must hit exactly
what our replay at block size 1 hits: the longest cached prefix of each prompt less its last
token. With a small cache both evict and the SGLang side must end with every KV slot either
free or cached, no request failing that ours serves.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from types import ModuleType

import pytest

from lpc.drivers.vllm_driver import REPO_ROOT


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sglang_trace_ab", REPO_ROOT / "scripts" / "sglang_trace_ab.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_trace(path: Path, seed: int = 0) -> Path:
    """Eight conversations of four turns sharing a system prompt, arrivals interleaved; half
    of them under a tenant's cache salt, which must keep them apart from the others."""
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(40)]
    lines = []
    for c in range(8):
        history = list(system)
        t = rng.uniform(0, 20)
        for _turn in range(4):
            history += [rng.randrange(1000) for _ in range(rng.randint(10, 60))]
            output = [rng.randrange(1000) for _ in range(rng.randint(5, 40))]
            lines.append(
                {
                    "conversation_id": f"c{c}",
                    "arrival_s": t,
                    "completion_s": t + 2.0,
                    "prompt_token_ids": list(history),
                    "output_token_ids": output,
                    "probability": rng.choice([0.1, 0.5, 0.9, None]),
                    "cache_salt": "tenant-a" if c % 2 else None,
                }
            )
            history += output
            t += rng.uniform(5, 60)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.sglang
@pytest.mark.parametrize("kind", ["unified", "radix"])
def test_sglang_replay_without_eviction_hits_like_token_blocks(
    sglang_python: Path, tmp_path: Path, kind: str
) -> None:
    script = load_script()
    trace = write_trace(tmp_path / "t.jsonl")
    result = script.compare(trace, 1_000_000, [1, 16], 0.01, 0.5, kind, sglang_python)
    for row in result["rows"]:
        assert row["sglang_evicted_nodes"] == 0 and row["sglang_slots_accounted"]
        assert row["sglang_hit_ratio"] == row["ours_b1_hit_ratio"] > 0.5
        assert row["ours_b16_hit_ratio"] < row["ours_b1_hit_ratio"]


@pytest.mark.sglang
def test_sglang_replay_under_pressure_evicts_and_accounts_every_slot(
    sglang_python: Path, tmp_path: Path
) -> None:
    script = load_script()
    trace = write_trace(tmp_path / "t.jsonl")
    result = script.compare(trace, 1500, [1], 0.01, 0.5, "unified", sglang_python, True)
    rows = {row["sglang"]: row for row in result["rows"]}
    assert set(rows) == {"SGLang lru", "SGLang + LPC", "SGLang + LPC, ticks"}
    for row in rows.values():
        assert row["sglang_evicted_nodes"] > 0 and row["sglang_slots_accounted"]
        assert row["sglang_failures"] == row["ours_b1_failures"] == 0
        assert row["sglang_evicted_tokens"] >= row["sglang_evict_requested_tokens"] > 0
        assert 0 < row["sglang_hit_ratio"] < 1
    assert rows["SGLang + LPC"]["sglang_strategy"] == "LPCStrategy"
    assert rows["SGLang lru"]["sglang_strategy"] == "LRUStrategy"


def test_bad_trace_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = load_script()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversation_id": "c", "arrival_s": "soon", "completion_s": 1}\n')
    python = tmp_path / "python"
    python.write_text("")
    assert script.main([str(bad), "--cache-tokens", "100", "--sglang-python", str(python)]) == 2
    out = capsys.readouterr().out.strip()
    assert (
        out.startswith("sglang_trace_ab: error: ") and "bad.jsonl:1" in out and "arrival_s" in out
    )
    assert "\n" not in out
