"""The benchmark package's glue outside the timed code: the queue worker's command line, the
trace sample's rule, the load test's metric reading."""

from __future__ import annotations

from pathlib import Path

import pytest

from lpc.benchmarks.queue_driver import QueueBenchOptions, summary_lines, worker_command
from lpc.benchmarks.serve_load_test import OVERLOADED_SERIES, metric_value
from lpc.benchmarks.trace_release_bench import kept

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_the_trace_sample_keeps_what_sample_conversations_keeps(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    from sample_conversations import keep

    ids = [f"conversation-{i}" for i in range(500)] + ["", "é-ü", "0"]
    for one_in in (1, 3, 40):
        assert [kept(i, one_in) for i in ids] == [keep(i, one_in) for i in ids]
    assert 0 < sum(kept(i, 40) for i in ids) < len(ids)


@pytest.mark.parametrize(("switch", "scan"), [(False, False), (True, True)])
def test_the_queue_worker_gets_every_flag(switch: bool, scan: bool) -> None:
    options = QueueBenchOptions(
        "1024,2048",
        500,
        "lpc",
        "shadow",
        2000,
        64,
        5,
        switch,
        scan,
        manager=scan,
        pooled_memory="blocks",
    )
    argv = worker_command(Path("/venv/python"), options)
    assert argv[:3] == ["/venv/python", "-m", "lpc.benchmarks.queue_bench"]
    flags = dict(zip(argv[3:19:2], argv[4:19:2], strict=True))
    assert flags == {
        "--sizes": "1024,2048",
        "--budget-blocks": "500",
        "--evictor": "lpc",
        "--pooled-memory": "blocks",
        "--mode": "shadow",
        "--free-blocks": "2000",
        "--scan-blocks": "64",
        "--walks": "5",
    }
    assert ("--switch" in argv, "--scan" in argv, "--manager" in argv) == (switch, scan, scan)


def test_the_queue_report_has_a_row_per_call_and_the_optional_lines() -> None:
    def figures(p50: float) -> dict:
        return {op: {"p50_us": p50, "p99_us": 2 * p50} for op in ("touch", "alloc", "free")}

    size = {
        "tokens": 1024,
        "stock": figures(1.0),
        "lpc": figures(3.0),
        "ratio_p50": dict.fromkeys(("touch", "alloc", "free"), 3.0),
        "ratio_p99": dict.fromkeys(("touch", "alloc", "free"), 3.0),
    }
    record = {"evictor": "lpc", "mode": "lpc", "sizes": [size]}
    lines = summary_lines(record)
    assert len(lines) == 2 + 3
    assert lines[2].split() == ["1,024", "touch", "1.0", "3.0", "3.00", "3.00"]
    scan = {
        "scan_blocks": 64,
        "stock": {"p50_us": 1.0},
        "lpc": {"p50_us": 2.0},
        "ratio_p50": 2.0,
        "ratio_p99": 2.5,
        "ratio_per_block": 1.5,
    }
    with_scan = summary_lines({**record, "sizes": [{**size, "scan": scan}]})
    assert len(with_scan) == 6 and "offload walk of ≤64 blocks" in with_scan[-1]
    calls = ("allocate", "free")
    manager = {
        "stock": {c: {"p50_us": 10.0} for c in calls},
        "lpc": {c: {"p50_us": 15.0} for c in calls},
        "ratio_p50": dict.fromkeys(calls, 1.5),
        "ratio_p99": dict.fromkeys(calls, 2.0),
        "floor": {c: {"p50_us": 9.0} for c in calls},
        "floor_ratio_p50": dict.fromkeys(calls, 0.9),
        "floor_ratio_p99": dict.fromkeys(calls, 0.8),
    }
    with_manager = summary_lines({**record, "sizes": [{**size, "manager": manager}]})
    assert len(with_manager) == 7 and "KVCacheManager" in with_manager[-2]
    assert "free p50 10.0 µs vLLM, 15.0 µs LPC (1.50×, p99 2.00×)" in with_manager[-2]
    assert "the floor" in with_manager[-1]
    assert "free p50 9.0 µs (0.90×, p99 0.80×)" in with_manager[-1]
    pooled = {
        **manager,
        "pooled_floor": {c: {"p50_us": 12.0} for c in calls},
        "pooled_floor_ratio_p50": dict.fromkeys(calls, 1.2),
        "pooled_floor_ratio_p99": dict.fromkeys(calls, 1.3),
    }
    with_pooled = summary_lines({**record, "sizes": [{**size, "manager": pooled}]})
    assert len(with_pooled) == 8 and "the pooled floor" in with_pooled[-1]
    assert "free p50 12.0 µs (1.20×, p99 1.30×)" in with_pooled[-1]


def test_the_load_test_reads_the_servers_overload_count() -> None:
    page = "\n".join(
        [
            "# HELP lpc_predictor_errors_total errors",
            'lpc_predictor_errors_total{kind="invalid_input"} 2.0',
            f"{OVERLOADED_SERIES} 7.0",
            'lpc_predictor_errors_created{kind="overloaded"} 1.7e9',
        ]
    )
    assert metric_value(page, OVERLOADED_SERIES) == 7.0
    assert metric_value(page, 'lpc_predictor_errors_total{kind="timeout"}') == 0.0


def test_no_benchmark_script_is_left_outside_the_package() -> None:
    """A script under scripts/ that benchmarks is a command line over lpc.benchmarks."""
    for script in SCRIPTS.glob("*bench*.py"):
        text = script.read_text()
        assert "from lpc.benchmarks" in text, script
        assert text.count("\ndef ") <= 2, f"{script} holds more than its command line"
