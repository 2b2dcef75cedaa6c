"""`lpc bench step-scoring` runs end to end and reports every figure (the speed itself lives in
the docs, never in a test): one model call per step on one side, one per request on the other."""

from __future__ import annotations

import json

from lpc.cli.main import main


def test_lpc_bench_step_scoring_reports_its_figures(capsys) -> None:
    assert main(["bench", "step-scoring", "--finished", "1,3", "--steps", "6", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cold"] is False
    assert [f["finished"] for f in report["figures"]] == [1, 3]
    for figure in report["figures"]:
        n = figure["finished"]
        assert figure["steps"] == 6
        assert figure["calls_one_by_one"] == 6 * n and figure["calls_one_call"] == 6
        assert figure["one_by_one_us"] > 0 and figure["one_call_us"] > 0
        assert figure["ratio"] == figure["one_call_us"] / figure["one_by_one_us"]


def test_lpc_bench_step_scoring_rejects_bad_counts(capsys) -> None:
    assert main(["bench", "step-scoring", "--finished", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err
    assert main(["bench", "step-scoring", "--finished", "a"]) == 2
    assert "comma-separated counts" in capsys.readouterr().err
