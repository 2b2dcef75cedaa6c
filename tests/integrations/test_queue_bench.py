"""`lpc bench queue` runs end to end against vLLM's queue and reports every figure (the ratio
targets live in docs/serving.md and the benchmark, never in a test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpc.cli.main import main


def test_lpc_bench_queue_names_a_missing_vllm_venv(capsys, tmp_path: Path) -> None:
    missing = tmp_path / "no-venv" / "python"
    assert main(["bench", "queue", "--vllm-python", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "setup_vllm_venv.sh" in err


def test_lpc_bench_queue_rejects_bad_sizes(capsys) -> None:
    assert main(["bench", "queue", "--sizes", "1k"]) == 2
    assert "comma-separated token counts" in capsys.readouterr().err
    assert main(["bench", "queue", "--sizes", "16"]) == 2
    assert "below two blocks" in capsys.readouterr().err


def test_lpc_bench_queue_rejects_an_unknown_mode(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "queue", "--mode", "off"])
    assert exit_info.value.code == 2 and "--mode" in capsys.readouterr().err


@pytest.mark.vllm
def test_lpc_bench_queue_times_both_queues(vllm_python: Path, capsys) -> None:
    args = ["bench", "queue", "--sizes", "256,1024", "--budget-blocks", "64", "--json"]
    assert main([*args, "--vllm-python", str(vllm_python)]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["evictor"] == "lpc-pooled" and figures["block_size"] == 16
    assert figures["mode"] == "lpc"
    assert [size["tokens"] for size in figures["sizes"]] == [256, 1024]
    for size in figures["sizes"]:
        assert size["requests"] == 20 and size["blocks_per_request"] == size["tokens"] // 16
        for side in ("stock", "lpc"):
            for op in ("touch", "alloc", "free"):
                figure = size[side][op]
                assert 0 < figure["p50_us"] <= figure["p99_us"], (side, op)
        assert set(size["ratio_p50"]) == {"touch", "alloc", "free"}


@pytest.mark.vllm
def test_lpc_bench_queue_times_the_kill_switch(vllm_python: Path, capsys) -> None:
    """`--mode lru`: the plugin's queue evicts in LRU order; every figure is still there."""
    args = ["bench", "queue", "--sizes", "256", "--budget-blocks", "64", "--mode", "lru"]
    assert main([*args, "--json", "--vllm-python", str(vllm_python)]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["mode"] == "lru" and figures["sizes"][0]["requests"] == 20
    for op in ("touch", "alloc", "free"):
        assert figures["sizes"][0]["lpc"][op]["p50_us"] > 0
