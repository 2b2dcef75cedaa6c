"""`lpc bench release` runs end to end and reports every figure (the speed target lives in
the docs and the benchmark, never in a test)."""

from __future__ import annotations

import gc
import json

import pytest

from lpc.cli.main import main


@pytest.fixture(autouse=True)
def frozen_heap():
    """The bench collects garbage before it times; the objects the test process already holds
    (torch, the other tests' modules) are moved out of the collector's reach meanwhile, so
    that collection walks only what the bench made."""
    gc.freeze()
    yield
    gc.unfreeze()


def test_lpc_bench_release_reports_its_figures(capsys) -> None:
    args = ["bench", "release", "--sizes", "256,2048", "--releases", "40", "--json"]
    assert main([*args, "--conversations", "4"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert [s["tokens"] for s in figures["sizes"]] == [256, 2048]
    assert figures["evictor"] == "lpc-pooled" and figures["block_size"] == 16
    for size in figures["sizes"]:
        assert size["releases"] == 40 and size["blocks_per_release"] == size["tokens"] // 16
        # The features saw the conversation's history as the shared prefix.
        assert size["shared_prefix_tokens"] >= size["tokens"] - 128 - 16
        for part in ("release_for", "append_n", "total"):
            latency = size[part]
            assert 0 < latency["p50_us"] <= latency["p99_us"] <= latency["max_us"], part
        assert isinstance(size["target_met"], bool)


def test_lpc_bench_release_rejects_a_size_too_small(capsys) -> None:
    assert main(["bench", "release", "--sizes", "100"]) == 2
    assert "below the smallest request" in capsys.readouterr().err
    assert main(["bench", "release", "--sizes", "1k"]) == 2
    assert "comma-separated token counts" in capsys.readouterr().err


def test_lpc_bench_release_times_the_return_time_evictor(capsys) -> None:
    args = ["bench", "release", "--sizes", "256", "--releases", "20", "--json"]
    assert main([*args, "--conversations", "4", "--evictor", "lpc-return"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["evictor"] == "lpc-return" and figures["model"] is None
    assert figures["return_model"].endswith("mooncake-return")
    assert figures["sizes"][0]["release_for"]["p50_us"] > 0
    assert main(["bench", "release", "--return-model", "x"]) == 2
    assert "--return-model is for --evictor lpc-return" in capsys.readouterr().err
