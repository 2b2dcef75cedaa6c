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
    """`--mode lru`: the plugin's queue is vLLM's own; every figure is still there."""
    args = ["bench", "queue", "--sizes", "256", "--budget-blocks", "64", "--mode", "lru"]
    assert main([*args, "--json", "--vllm-python", str(vllm_python)]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["mode"] == "lru" and figures["sizes"][0]["requests"] == 20
    for op in ("touch", "alloc", "free"):
        assert figures["sizes"][0]["lpc"][op]["p50_us"] > 0


@pytest.mark.vllm
def test_lpc_bench_queue_times_the_switch_and_the_offload_walk(vllm_python: Path, capsys) -> None:
    """`--switch --scan`: the switch's cost, the drain's allocations and the lazy-offload walk
    are reported per size, in JSON and in the table."""
    args = ["bench", "queue", "--sizes", "256", "--budget-blocks", "64", "--switch", "--scan"]
    args += ["--free-blocks", "2000", "--walks", "20", "--vllm-python", str(vllm_python)]
    assert main([*args, "--json"]) == 0
    size = json.loads(capsys.readouterr().out)["sizes"][0]
    switch, scan = size["switch"], size["scan"]
    assert switch["free_blocks"] == 2000 and switch["drain_allocations"] > 0
    assert 0 < switch["drain_alloc"]["p50_us"] <= switch["drain_alloc_max_us"]
    assert switch["switch_off_us"] > 0 and switch["switch_on_us"] > 0
    assert scan["walks"] == 20 and scan["scan_blocks"] == 1024
    assert scan["stock"]["p50_us"] > 0 and scan["lpc"]["p50_us"] > 0
    assert scan["lpc_blocks_per_walk"] > 0 and scan["ratio_per_block"] > 0
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "switch at 2,000 free blocks" in table and "offload walk" in table
