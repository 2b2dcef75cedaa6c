"""`lpc vllm-ab --time-steps`: the per-step CPU summary the driver writes, and the ratio to
lru's that the table prints (the figures themselves are measured, never asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from lpc.drivers.scheduler_ab import print_plugin_timers, print_scheduler_cpu
from lpc.drivers.vllm_scheduler import plugin_timers

DRIVER = Path(__file__).resolve().parents[2] / "scripts" / "vllm_scheduler_replay.py"


def driver_module():
    spec = importlib.util.spec_from_file_location("vllm_scheduler_replay", DRIVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports vLLM only inside its functions
    return module


def test_the_summary_adds_every_step_and_the_requests_added():
    ms = 1_000_000  # ns
    summary = driver_module().scheduler_cpu([3 * ms, 1 * ms, 2 * ms, 4 * ms], ms // 2)
    assert summary == {
        "total_s": 0.0105,
        "add_request_s": 0.0005,
        "steps": 4,
        "step_mean_us": 2500.0,
        "step_p50_us": 3000.0,
        "step_p99_us": 4000.0,
    }
    assert driver_module().scheduler_cpu([], 0)["step_p50_us"] == 0.0


def test_the_table_gives_each_policy_its_ratio_to_lru(capsys):
    def cpu(total: float, p50: float) -> dict:
        return {"total_s": total, "steps": 10, "step_p50_us": p50, "step_p99_us": 2 * p50}

    rows = [
        {"policy": "lru", "scheduler_cpu": cpu(2.0, 100.0)},
        {"policy": "lpc-pooled", "scheduler_cpu": cpu(2.5, 120.0)},
        {"policy": "lpc", "scheduler_cpu": None},  # not timed: no line
    ]
    print_scheduler_cpu(rows)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "lru: scheduler CPU 2.000 s over 10 steps (p50 100 us, p99 200 us)",
        "lpc-pooled: scheduler CPU 2.500 s over 10 steps (p50 120 us, p99 240 us); "
        "1.250x lru in all, 1.200x at p50",
    ]


def test_the_plugin_s_timers_come_from_its_histograms(capsys):
    def histogram(total: float, count: int) -> dict:
        return {"bounds": [1e-06], "counts": [0, count], "total": total, "count": count}

    stats = {
        "histograms": {
            "scoring_seconds": histogram(0.25, 5),
            "free_seconds": histogram(0.5, 7),
            "release_seconds": histogram(0.125, 7),
            "eviction_age_seconds": histogram(9.0, 3),  # not a timer
        }
    }
    timers = plugin_timers(stats)
    assert timers == {
        "scoring_seconds": {"total_s": 0.25, "count": 5},
        "free_seconds": {"total_s": 0.5, "count": 7},
        "release_seconds": {"total_s": 0.125, "count": 7},
    }
    assert plugin_timers({}) is None  # stock vLLM: no plugin stats
    cpu = {"total_s": 2.0, "steps": 10, "step_p50_us": 1.0, "step_p99_us": 2.0}
    print_plugin_timers({"policy": "lpc-pooled", "plugin_timers": timers, "scheduler_cpu": cpu})
    print_plugin_timers({"policy": "lpc", "plugin_timers": timers, "scheduler_cpu": None})
    print_plugin_timers({"policy": "lru", "plugin_timers": None, "scheduler_cpu": cpu})
    assert capsys.readouterr().out.splitlines() == [
        "lpc-pooled: the plugin's timers: 0.250 s in 5 scoring passes, 0.500 s in 7 frees "
        "(vLLM's own loop included), of which 0.125 s in 7 releases"
    ]
