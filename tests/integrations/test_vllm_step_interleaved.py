"""`lpc vllm-ab --time-steps --interleave`: stock vLLM's `Scheduler` and `LPCScheduler` in one
process, stepped in turn (`lpc.drivers.step_interleave`). The report's structure, that both
engines served the same requests, and that the stock engine beside LPC's schedules as stock
vLLM alone does; no timing is asserted. The engine test is marked `vllm` (vLLM's venv).
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from lpc.drivers.release_plan import PluginSettings
from lpc.drivers.scheduler_ab import compare
from lpc.drivers.step_interleave import StepTimes, interleave, step_report
from lpc.drivers.vllm_scheduler import SCHEDULER_CLASS
from tests.integrations.test_vllm_scheduler import rows_of, sharegpt_like
from tests.integrations.test_vllm_seam import ENGINE


def test_interleave_alternates_who_steps_first_and_runs_the_longer_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    # Counted, not run: a full collection of the test process's heap costs about half a
    # second, and what is checked is when the loop asks for one (with the collector off).
    collections: list[bool] = []
    monkeypatch.setattr(gc, "collect", lambda: collections.append(gc.isenabled()))

    def engine(name: str, steps: int):
        for k in range(steps):
            calls.append(name)
            yield 10 * k + 1

    times = interleave(engine("stock", 4), engine("lpc", 6), collect_every=2)
    assert calls == ["stock", "lpc", "lpc", "stock", "stock", "lpc", "lpc", "stock", "lpc", "lpc"]
    assert times.stock_ns == [1, 11, 21, 31] and times.lpc_ns == [1, 11, 21, 31, 41, 51]
    assert times.alone == 2 and times.stock_first == 2
    # once before the first pair (the collector still on), then every second pair of six
    assert collections == [True, False, False, False]
    assert gc.isenabled()


def test_step_report_ratios_and_interval() -> None:
    rng = np.random.default_rng(0)
    stock = rng.integers(50_000, 150_000, 5000).tolist()
    lpc = [int(1.2 * v) for v in stock] + [100_000] * 10
    report = step_report(StepTimes(stock, lpc, 2500, 10), block_steps=100)
    assert report["stock"]["steps"] == 5000 and report["lpc"]["steps"] == 5010
    assert report["pairs"] == 5000 and report["steps_alone"] == 10
    total = sum(lpc) / sum(stock)
    assert report["ratio"]["total"] == pytest.approx(total, rel=1e-6)
    assert report["ratio"]["p50"] == pytest.approx(1.2, rel=5e-3)
    low, high = report["total_ratio_interval"]
    assert low <= total <= high and high - low < 0.01
    assert report["bootstrap"]["blocks"] == 51
    same = step_report(StepTimes(stock, list(stock)), block_steps=100)
    assert same["ratio"]["total"] == 1.0 and same["total_ratio_interval"] == [1.0, 1.0]
    assert step_report(StepTimes([5], [6]))["total_ratio_interval"] is None  # one block


def test_interleaving_takes_no_stock_policy() -> None:
    with pytest.raises(ValueError, match="leave lru out"):
        compare(
            "unused", "lru,lpc-pooled", ENGINE, PluginSettings(), Path("unused"), interleave=True
        )


@pytest.mark.vllm
def test_stock_and_the_scheduler_class_interleaved_serve_the_same_requests(
    vllm_python: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "chats.jsonl"
    count = sharegpt_like(trace, conversations_count=30, duration_s=40)
    common = dict(time_steps=True)
    both = compare(
        str(trace), "lpc-pooled", ENGINE, PluginSettings(), vllm_python, interleave=True, **common
    )
    alone = compare(str(trace), "lru", ENGINE, PluginSettings(), vllm_python, **common)
    assert both["ok"], both["checks"]
    assert both["interleaved"] is True
    check = both["checks"]["lpc-pooled_interleaved"]
    assert check == {
        "ok": True,
        "same_requests": True,
        "every_request_finished": True,
        "stock_is_vllm_scheduler": True,
        "stock_invariants": True,
    }
    assert both["vllm"]["lpc-pooled"]["scheduler"] == SCHEDULER_CLASS
    row = rows_of(both)["lpc-pooled"]
    report = row["interleaved"]
    digests = report["request_digests"]
    assert digests["stock"] == digests["lpc"] != 0
    stock = report["stock_engine"]
    assert stock["totals"]["requests"] == stock["totals"]["finished"] == count
    assert row["requests"] == row["finished"] == count
    # The stock engine beside LPC's schedules as stock vLLM alone in its process.
    lru = rows_of(alone)["lru"]
    for key in ("prefix_cache_hits", "prefix_cache_queries", "steps", "preemptions", "evictions"):
        assert stock["totals"][key] == lru[key], key
    assert row["prefix_cache_hits"] != lru["prefix_cache_hits"]
    # The plugin's own timers: every free timed, its release inside it; no model, no scoring.
    timers = row["plugin_timers"]
    free, release = timers["free_seconds"], timers["release_seconds"]
    frees = row["releases"] + row["protected_releases"]  # finished, and preempted
    assert free["count"] == release["count"] == frees > row["releases"] > 0
    assert 0 < release["total_s"] < free["total_s"]
    assert timers["scoring_seconds"] == {"total_s": 0.0, "count": 0}
    # Every timed step of each engine, the same totals as the engine's own timing.
    for side, cpu in (("stock", stock["scheduler_cpu"]), ("lpc", row["scheduler_cpu"])):
        assert report[side]["steps"] == cpu["steps"] > 0
        assert report[side]["cpu_s"] == pytest.approx(cpu["total_s"], abs=2e-6)
        assert 0 < report[side]["step_p50_us"] <= report[side]["step_p99_us"]
    pairs = report["pairs"]
    assert pairs == min(report["stock"]["steps"], report["lpc"]["steps"])
    assert report["steps_alone"] == abs(report["stock"]["steps"] - report["lpc"]["steps"])
    assert abs(report["stock_first_pairs"] - pairs / 2) <= 1
    ratio = report["ratio"]
    assert ratio["total"] == pytest.approx(report["lpc"]["cpu_s"] / report["stock"]["cpu_s"])
    assert set(ratio) == {"total", "p50", "p99"}
    low, high = report["total_ratio_interval"]
    assert low <= ratio["total"] <= high
    assert report["bootstrap"]["blocks"] == -(-max(pairs + report["steps_alone"], 1) // 1000)


@pytest.mark.vllm
def test_the_floor_queue_beside_stock_serves_every_step_as_stock_vllm(
    vllm_python: Path, tmp_path: Path
) -> None:
    """`floor` is stock vLLM with the floor queue in its block pool: interleaved with stock,
    the same steps, hits and evictions (it evicts in vLLM's LRU order), so its ratio is the
    queue's cost alone."""
    trace = tmp_path / "chats.jsonl"
    sharegpt_like(trace, conversations_count=30, duration_s=40)
    both = compare(str(trace), "floor", ENGINE, PluginSettings(), vllm_python, interleave=True)
    assert both["ok"], both["checks"]
    assert both["checks"]["floor_equals_lru"]["equal"] is True
    row = rows_of(both)["floor"]
    stock = row["interleaved"]["stock_engine"]["totals"]
    assert row["evictions"] == stock["evictions"] > 0  # the floor's pops ran
    assert row["prefix_cache_hits"] == stock["prefix_cache_hits"] > 0
    assert row["steps"] == stock["steps"]
    engine = both["vllm"]["floor"]
    assert engine["queue"] == "RunFloorQueue" and engine["environment"] == {"VLLM_PLUGINS": ""}
