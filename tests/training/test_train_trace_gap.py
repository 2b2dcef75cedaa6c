"""`lpc train --trace` on a trace with one request stamped days ahead (issue 44's sibling of
the daily job's thin evaluation part): the refusal names the empty validation slice, the
gap and the one request beyond it, in the daily job's words, not a shorter --horizon."""

from __future__ import annotations

from pathlib import Path

import pytest

from lpc.cli.main import main
from tests.training.test_retrain_bad_logs import refused
from tests.training.test_retrain_traces import DAY_S, HOURS_4_S
from tests.training.trace_logs import TraceRequest, chats, write_mooncake

REFUSAL = (
    "no usable samples: the validation slice of the training part holds no request (its last "
    "30% in time, 95,698 s to 136,712 s after the first arrival): the next, 'line{n}', arrives "
    "3.0 days after the one before it, and begins an evaluation part of 1 request. A clock "
    "ahead? Remove those requests, or pass --split-at in seconds; a gap in the traffic? "
    "another --split-at or --validation-share"
)


def trace_with_a_line_days_ahead(path: Path) -> tuple[Path, int]:
    """Four hours of chats and one request three days after them (Mooncake, relative ms)."""
    requests = chats(HOURS_4_S, 120, seed=3)
    ahead_s = requests[-1].arrival_s + 3 * DAY_S
    requests.append(TraceRequest(9999, 0, ahead_s, ahead_s + 2, 600, 30))
    return write_mooncake(path, requests), len(requests)


def test_a_line_days_ahead_is_named_not_blamed_on_the_horizon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, n = trace_with_a_line_days_ahead(tmp_path / "m.jsonl")
    out = tmp_path / "model"
    assert main(["train", "--trace", str(trace), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "lpc train: error: " + REFUSAL.format(n=n)
    assert "--horizon" not in err and not out.exists()


def test_the_daily_job_with_split_at_names_the_same_gap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --split-at the daily job judges the operator's cut as it falls (no thin-day
    check), and the same empty validation slice is refused in the same words."""
    _, n = trace_with_a_line_days_ahead(tmp_path / "logs" / "m.jsonl")
    line = refused(tmp_path / "logs", tmp_path / "registry", capsys, "--split-at", "0.5")
    assert line == "lpc retrain: error: " + REFUSAL.format(n=n)
