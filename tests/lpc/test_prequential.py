"""Prequential windows: the grid, the counted range and the warm-up of a window's replay, the
training cut that never reaches t, the quality figures' bootstrap, and the command's errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lpc.access.prequential import (
    Window,
    check_window_bookkeeping,
    window_grid,
    window_training_options,
)
from lpc.access.prequential_report import markdown_report, verdict
from lpc.access.window_quality import conversation_bootstrap, window_rows
from lpc.cli.main import main
from lpc.errors import InvalidInputError
from lpc.replay.ab_options import TRACE_MAX_MODEL_LEN, ABOptions
from lpc.replay.ab_plan import replay_until
from lpc.replay.ab_run import run_ab
from lpc.replay.policies import parse_policies, parse_policy
from lpc.replay.simulator import prepare, replay
from lpc.traces.load import TraceOptions, load_trace
from lpc.traces.timeline import split_in_time
from lpc.workload import ScriptedTurn, WorkloadRequest
from tests.lpc.traces.helpers import bundled_lines, write_lines
from training.access_data import access_samples
from training.return_data import return_samples


def test_the_default_grid_and_its_refusals() -> None:
    windows = window_grid((1200, 1800, 2400, 3000), 600)
    assert [(w.start_s, w.end_s) for w in windows] == [
        (1200, 1800),
        (1800, 2400),
        (2400, 3000),
        (3000, 3600),
    ]
    assert windows[0].label() == "20–30 min" and windows[0].name == "t1200"
    with pytest.raises(InvalidInputError, match="ascend"):
        window_grid((1200, 1500), 600)  # overlapping windows
    with pytest.raises(InvalidInputError, match="seconds >= 1"):
        window_grid((0.5,), 600)  # would read as a fraction of the span
    with pytest.raises(InvalidInputError, match="> 0"):
        window_grid((1200,), 0)


def _request(conversation: str, turn: int, arrival_s: float) -> WorkloadRequest:
    tokens = list(range(64 * (turn + 1)))
    scripted = ScriptedTurn(conversation, turn, tokens, 48 * (turn + 1), True)
    return WorkloadRequest(f"{conversation}-{turn}", scripted, arrival_s, arrival_s + 1.0)


def _table(requests: list[WorkloadRequest]) -> pd.DataFrame:
    from lpc.replay.request_table import request_table

    return request_table(requests)


def test_a_windows_training_data_end_before_t() -> None:
    """Both trainers' cuts put a request arriving exactly at t (and every later one) outside
    the training part, and no training label or return time reads an arrival at or after t
    (a trace in whole seconds has requests arriving exactly at t)."""
    t = 100.0
    window = Window(t, t + 60.0)
    requests = [
        _request("a", 0, 0.0),
        _request("b", 0, 10.0),
        _request("a", 1, 30.0),
        _request("a", 2, 60.0),  # the fitting slice (before 70 s)
        _request("b", 1, 80.0),  # the validation slice [70 s, t)
        _request("b", 2, t),  # b returns exactly at t, 19 s after b-1's completion
        _request("a", 3, t + 20.0),  # a returns inside the window
        _request("c", 0, t + 30.0),
    ]
    access_options, return_options = window_training_options("mooncake", window)
    assert access_options.split_at == return_options.split_at == t
    split = split_in_time(requests, access_options.split_at)
    arrivals = np.array([r.arrival_s for r in requests])
    assert split.cut_s == t and (arrivals[: split.first_eval] < t).all()
    assert arrivals[split.first_eval] == t  # the request at t is the window's first

    table = _table(requests)
    samples = access_samples(table, ["log_turn"], split.cut_s, horizon_s=30.0)
    assert samples.parts.evaluation == split.first_eval
    # b-1 completes at 81 s; its next request (at t) is not training data: with no next
    # request seen and 81 + 30 > t it is censored, never labelled "returns within 30 s"
    assert samples.labels["validation"].size == 0 and samples.censored["validation"] == 1

    training = return_samples(table, ["log_turn"], split.cut_s).parts["training"]
    assert training.rows.max() < split.first_eval
    b1 = int(np.flatnonzero(arrivals == 80.0)[0])
    assert not training.targets.observed[b1]  # the return at t lies outside the training data
    assert training.targets.time_s[b1] == pytest.approx(t - 81.0)


def test_check_window_bookkeeping_refuses_a_training_cut_past_t() -> None:
    window = Window(1200.0, 1800.0)
    replay = {
        "workload": {"trace": {"split": {"cut_after_start_s": 1200.0, "replay_until_s": 1800.0}}}
    }
    good = {"access_report": {"split": {"cut_after_start_s": 1200.0}}}
    check_window_bookkeeping(window, good, replay)
    late = {"return_report": {"split": {"cut_after_start_s": 1201.0}}}
    with pytest.raises(AssertionError, match="trained before 1201"):
        check_window_bookkeeping(window, late, replay)


def test_replay_until_counts_the_window_and_warms_on_everything_before() -> None:
    requests = [_request(f"c{i}", 0, float(i)) for i in (0, 5, 10, 10, 20, 30, 30, 40)]
    split = split_in_time(requests, 10.0)  # requests [0, 2) warm the cache
    window, kept = replay_until(requests, split, 30.0)
    assert (window.first_eval, kept) == (2, 5)  # counted: the arrivals in [10 s, 30 s)
    assert window.train_requests == 2 and window.eval_requests == 3
    _, kept = replay_until(requests, split, 31.0)
    assert kept == 7  # both requests at 30 s are in [10 s, 31 s)
    with pytest.raises(InvalidInputError, match="must lie after the split"):
        replay_until(requests, split, 10.0)


@pytest.fixture(scope="module")
def slice_path(tmp_path_factory) -> Path:
    return write_lines(tmp_path_factory.mktemp("trace") / "slice.jsonl", bundled_lines()[:300])


@pytest.mark.usefixtures("no_plots")  # reads no PNG
def test_a_window_replay_hits_what_the_whole_replay_hits_there(
    slice_path: Path, tmp_path: Path
) -> None:
    """LRU is causal: `lpc ab` stopped at t + Δ hits on [t, t + Δ) exactly what a replay of
    the whole slice hits there; the requests before t warm the cache and are not counted."""
    options = ABOptions(
        trace=slice_path,
        split_at=40.0,
        replay_until_s=70.0,
        policies=tuple(parse_policies("lru")),
        cache_sizes_tokens=(1_000_000,),
        workers=1,
        progress=False,
        out_dir=tmp_path,
    )
    window = run_ab(options, log=lambda _: None)
    split = window.workload_summary["trace"]["split"]
    assert split["cut_after_start_s"] == 40.0 and split["replay_until_s"] == 70.0

    requests = load_trace(slice_path, TraceOptions(max_model_len=TRACE_MAX_MODEL_LEN)).requests
    arrivals = np.array([r.arrival_s for r in requests]) - requests[0].arrival_s
    first, end = int((arrivals < 40.0).sum()), int((arrivals < 70.0).sum())
    assert window.workload_summary["requests"] == end - first > 0
    assert window.workload_summary["replayed_requests"] == end
    whole = replay(prepare(requests, 512, {}, first_counted=first), parse_policy("lru"), 1_000_000)
    ours, theirs = window.results[0].per_request, whole.per_request
    assert ours is not None and theirs is not None
    assert np.array_equal(ours.hit_tokens, theirs.hit_tokens[: end - first])
    assert ours.hit_tokens.sum() > 0  # the warm-up left something to hit


def test_conversation_bootstrap() -> None:
    conversations = np.array(["a", "a", "b", "c", "c", "d"])
    values = np.array([1.0, 1.0, 0.0, 2.0, 2.0, 5.0])

    def mean(weights: np.ndarray) -> float:
        return float(np.average(values, weights=weights))

    estimate = conversation_bootstrap(mean, conversations, n_resamples=200)
    assert estimate.value == pytest.approx(values.mean())
    assert estimate.low is not None and estimate.high is not None
    assert estimate.low < estimate.value < estimate.high
    one = conversation_bootstrap(lambda w: float(w.sum()), np.array(["a", "a"]))
    assert one.value == 2.0 and one.low is None  # one conversation: nothing to resample


def test_window_rows_and_verdicts() -> None:
    table = pd.DataFrame({"arrival_s": [0.0, 5.0, 10.0, 15.0, 20.0]})
    assert window_rows(table, 5.0, 20.0).tolist() == [1, 2, 3]
    assert verdict([0.01, 0.2]) == "above"
    assert verdict([-0.2, -0.01]) == "below"
    assert verdict([-0.1, 0.1]) == "level"
    assert verdict(None) == ""


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--starts", "1200,1500"], "ascend"),
        (["--starts", "0.5"], "seconds >= 1"),
        (["--policies", "lpc-pooled"], "must include lru"),
        (["--policies", "nope"], "nope"),
    ],
)
def test_bad_arguments_fail_in_one_line(args, words, tmp_path: Path, capsys) -> None:
    code = main(["prequential", *args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and words in err, err


def test_a_bad_width_fails_in_argparse(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["prequential", "--width", "0"])
    assert stop.value.code == 2
    assert "--width" in capsys.readouterr().err


def _window_json(start_s: float, lpc_ci: list[float]) -> dict:
    sizes = {"1000000": None}
    return {
        "window": {"start_s": start_s, "end_s": start_s + 600.0},
        "quality": {
            "classifier": {"samples": 10, "roc_auc": {"value": 0.7, "ci95": [0.6, 0.8]}},
            "return_model": {
                "samples": 10,
                "model": {
                    "concordance": 0.65,
                    "concordance_ci95": [0.6, 0.7],
                    "integrated_brier": 0.2,
                    "auc": {"60": 0.6, "180": 0.7, "600": 0.7},
                },
                "km_per_turn": {"concordance": 0.6, "auc": {"180": 0.62}},
            },
        },
        "replay": {
            "workload": {
                "requests": 5,
                "conversations": 3,
                "prompt_tokens": 100,
                "replayed_requests": 9,
            },
            "comparison": {
                "hit_ratio": {"lru": {"1000000": 0.1}, "lpc": {"1000000": 0.12}},
                "gain_over_lru": {"lru": {"1000000": 0.0}, "lpc": {"1000000": 0.2}},
                "gain_over_lru_ci95": {"lpc": {"1000000": lpc_ci}},
                "gap_closed_belady": {"lpc": sizes},
            },
        },
    }


def test_the_report_counts_each_windows_verdict() -> None:
    windows = [_window_json(1200.0, [0.1, 0.3]), _window_json(1800.0, [-0.3, -0.1])]
    text = markdown_report(windows)
    assert "lpc: above in 1, level in 0, below in 1 (30–40 min 1M)" in text
    assert "| 20–30 min | +20.0% [+10.0%, +30.0%] |" in text
    assert "0.700 [0.600, 0.800]" in text
