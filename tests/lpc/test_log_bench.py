"""`lpc bench log` runs end to end and reports every figure (speed targets live in docs)."""

from __future__ import annotations

import json

from lpc.cli.main import main


def test_lpc_bench_log_reports_its_figures(capsys) -> None:
    assert main(["bench", "log", "--conversations", "12", "--repeats", "1", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["requests"] > 12 and figures["repeats"] == 1
    for key in ("release_calls_us", "plugin_record_us", "writer_records_per_s"):
        assert figures[key] > 0, key
    assert figures["writer_bytes_per_record"] > 100


def test_lpc_bench_log_rejects_a_bad_count(capsys) -> None:
    assert main(["bench", "log", "--repeats", "0"]) == 2
    assert "--repeats must be positive" in capsys.readouterr().err
