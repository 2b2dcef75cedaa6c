"""`lpc retrain` on logs that were joined, mixed or stamped wrongly (issue 44, cases 8, 13
and 14): a refusal in one line naming the file and line or the setting, exit 2, nothing
trained and the files left new for a fixed rerun."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from tests.lpc.traces.test_joined_logs import request_log
from tests.training.test_retrain_traces import DAY_S, HOURS_4_S, cli, two_utc_days_start_s
from tests.training.trace_logs import TraceRequest, chats, write_lpc, write_mooncake
from training.model_registry import ModelRegistry


def refused(logs: Path, registry: Path, capsys, *extra: str) -> str:
    """The one-line error of a refused run; nothing published, no file recorded as seen."""
    code, err = cli(logs, registry, capsys, *extra)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    store = ModelRegistry(registry)
    assert store.versions() == [] and "seen_files" not in store.state()
    return lines[0]


def test_a_request_stamped_days_ahead_is_named_as_a_thin_newest_day(tmp_path: Path, capsys):
    start = two_utc_days_start_s()
    requests = chats(2 * DAY_S, 60, seed=1, start_s=start)
    last = requests[-1]
    ahead_s = last.arrival_s + 3 * DAY_S
    requests.append(TraceRequest(9999, 0, ahead_s, ahead_s + 2, 600, 30))
    write_lpc(tmp_path / "logs" / "log.jsonl", requests)
    day = dt.datetime.fromtimestamp(ahead_s, dt.UTC).strftime("%Y-%m-%d")
    line = refused(tmp_path / "logs", tmp_path / "registry", capsys)
    assert line == (
        f"lpc retrain: error: the newest UTC day, {day}, holds only 1 request (the first, "
        "'c9999#0', arrives 3.0 days after the one before it): fewer than --min-eval-samples "
        "200 to judge a model on. A clock ahead? Remove those requests, run the job later in "
        "that day, or pass --split-at"
    )
    # the setting the message names decides
    again = refused(tmp_path / "logs", tmp_path / "registry", capsys, "--min-eval-samples", "2")
    assert "holds only 1 request" in again and "--min-eval-samples 2 " in again


def test_logs_joined_with_cat_are_refused_at_the_second_header(tmp_path: Path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    joined = logs / "all.jsonl"
    joined.write_text(request_log(1, "k1", 1203) + request_log(2, "k1", 1204))
    line = refused(logs, tmp_path / "registry", capsys)
    assert line.startswith(f"lpc retrain: error: {joined}:1205: a second header (the first is ")
    assert "were logs joined with cat? pass the files separately" in line


def test_logs_hashed_with_different_keys_are_refused(tmp_path: Path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "requests-2026-11-27-pid1-0.jsonl").write_text(request_log(1, "aaaa1111", 4))
    (logs / "requests-2026-11-27-pid2-0.jsonl").write_text(request_log(2, "bbbb2222", 4))
    line = refused(logs, tmp_path / "registry", capsys)
    assert line.startswith(
        f"lpc retrain: error: {logs}/requests-2026-11-27-pid2-0.jsonl:1: 'key_fingerprint' "
        f"'bbbb2222' differs from 'aaaa1111' in {logs}/requests-2026-11-27-pid1-0.jsonl"
    )


def test_a_relative_trace_with_a_line_days_ahead_is_refused_alike(tmp_path: Path, capsys):
    """The sibling on relative times: the half-way cut moves past every other request."""
    requests = chats(HOURS_4_S, 120, seed=3)
    ahead_s = requests[-1].arrival_s + 3 * DAY_S
    requests.append(TraceRequest(9999, 0, ahead_s, ahead_s + 2, 600, 30))
    write_mooncake(tmp_path / "logs" / "m.jsonl", requests)
    line = refused(tmp_path / "logs", tmp_path / "registry", capsys)
    assert line == (
        "lpc retrain: error: the evaluation part (last 50% of the span in time (relative "
        f"times)) holds only 1 request (the first, 'line{len(requests)}', arrives 3.0 days "
        "after the one before it): fewer than --min-eval-samples 200 to judge a model on. A "
        "clock ahead? Remove those requests, or pass --split-at"
    )
