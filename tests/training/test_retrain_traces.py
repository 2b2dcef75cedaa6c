"""`lpc retrain --logs DIR` on trace files (Mooncake, Bailian, the project's JSONL): an
access-only candidate on a time-ordered split, the same promotion guard, censoring, the lock
and bad input, like the conversation path (tests/training/test_training_retrain.py)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lpc.access.log_retrain import TraceLogTrainer, time_ordered_split
from lpc.cli.main import main
from lpc.traces.files import load_trace_files
from lpc.traces.load import TraceOptions
from predictor.access_predictor import AccessPredictor
from tests.training.synthetic import synthetic_conversations, write_openai_jsonl
from tests.training.trace_logs import (
    WRITERS,
    TraceRequest,
    chats,
    write_bailian,
    write_mooncake,
)
from training.access_fit import AccessFitConfig
from training.model_registry import ModelRegistry
from training.retrain import (
    BAD_INPUT,
    KEPT,
    LOCKED,
    PROMOTED,
    RetrainConfig,
    RetrainOutcome,
    run_retrain,
)

DAY_S = 86_400.0
HOURS_4_S = 4 * 3600.0
HORIZON_S = 180.0
# A quick fit: two members fitted to the labels alone (no gradient-boosted teacher), no refit
# on the whole training part (the CLI test below runs the defaults); the promotion rules judge
# whatever it learns.
QUICK_FIT = AccessFitConfig(
    ensemble=2, refit=False, teacher_share=0.0, max_epochs=20, patience=4, threads=1
)


def two_utc_days_start_s() -> float:
    """00:00 UTC of the day before yesterday: absolute times spanning two whole days."""
    return (time.time() // DAY_S - 2) * DAY_S


def late_single_requests(end_s: float, count: int = 30) -> list[TraceRequest]:
    """One-request conversations arriving in the data's last minute: the trace cannot say
    whether they continue (their horizon runs past its end)."""
    return [
        TraceRequest(10_000 + i, 0, end_s - 60 + i, end_s - 60 + i + 2, 600, 30)
        for i in range(count)
    ]


def trace_requests(fmt: str) -> list[TraceRequest]:
    """Two UTC days of absolute times for the project's JSONL (its newest day is judged on),
    four hours of relative times for Mooncake and Bailian (their last half is)."""
    if fmt == "lpc":
        start = two_utc_days_start_s()
        requests = chats(2 * DAY_S, 250, seed=1, start_s=start)
        requests += late_single_requests(start + 2 * DAY_S - 1)
        return sorted(requests, key=lambda r: r.arrival_s)
    return chats(HOURS_4_S, 300, seed=1)


def config(logs: Path, registry: Path, **kwargs) -> RetrainConfig:
    return RetrainConfig(
        logs_dir=logs, registry_dir=registry, cache_dir=registry.parent / "cache", **kwargs
    )


def retrain(logs: Path, registry: Path, **kwargs) -> RetrainOutcome:
    """One run through the Python API with a quick fit (the CLI's defaults fit longer)."""
    trainer = TraceLogTrainer(horizon_s=HORIZON_S, fit=QUICK_FIT)
    return run_retrain(
        config(logs, registry, **kwargs), _no_embedder, lambda m: None, log_trainer=trainer
    )


def _no_embedder(spec: str):
    raise AssertionError("trace files need no embedder")


def cli(logs: Path, registry: Path, capsys, *extra: str) -> tuple[int, dict | str]:
    code = main(["retrain", "--logs", str(logs), "--registry", str(registry), *extra])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if "--json" in extra else captured.err


FirstRun = tuple[list[TraceRequest], Path, RetrainOutcome]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> Callable[[str], FirstRun]:
    """A folder of one gzip trace file in a format, and the first retrain on it (run once per
    format for the module)."""
    runs: dict[str, FirstRun] = {}

    def run(fmt: str) -> FirstRun:
        if fmt not in runs:
            root = tmp_path_factory.mktemp(f"traces-{fmt}")
            requests = trace_requests(fmt)
            WRITERS[fmt](root / "logs" / f"{fmt}.jsonl.gz", requests, compress=True)
            runs[fmt] = requests, root, retrain(root / "logs", root / "registry")
        return runs[fmt]

    return run


@pytest.mark.parametrize("fmt", ["mooncake", "bailian", "lpc"])
def test_promotes_a_first_candidate_judged_on_the_later_part(first_run, fmt: str) -> None:
    requests, root, outcome = first_run(fmt)
    assert (outcome.status, outcome.exit_code) == (PROMOTED, 0), outcome.reason
    assert outcome.reason == "no current model"
    data = outcome.data
    assert data["trace_format"] == fmt and data["requests"] == len(requests)
    if fmt == "lpc":  # absolute UTC times over two days: the newest day is judged on
        newest = time.strftime("%Y-%m-%d", time.gmtime(requests[-1].arrival_s))
        assert (data["split_rule"], data["evaluation_day"]) == ("newest UTC day", newest)
        cut_s = two_utc_days_start_s() + DAY_S
    else:  # relative times: the last half of the span
        assert data["split_rule"].startswith("last 50% of the span")
        assert data["evaluation_day"] is None
        cut_s = (requests[0].arrival_s + requests[-1].arrival_s) / 2
    assert data["split"]["train_requests"] == sum(r.arrival_s < cut_s for r in requests)
    samples = data["samples"]
    assert samples["evaluation"]["samples"] > 200 and samples["fit"]["samples"] > 100
    assert outcome.candidate_metrics["roc_auc"] > 0.8  # the reply length tells them apart
    model = AccessPredictor.load(root / "registry" / "current")  # access-only, no text
    assert "log_output_tokens" in model.feature_names


def test_the_current_model_is_judged_on_the_same_samples_and_a_tie_promotes(first_run):
    _, root, first = first_run("mooncake")
    again = retrain(root / "logs", root / "registry")
    assert again.status == "no_new_data" and again.exit_code == 4
    forced = retrain(root / "logs", root / "registry", force=True)
    assert (forced.status, forced.exit_code) == (PROMOTED, 0), forced.reason
    assert forced.reason.startswith("not worse: candidate roc_auc")
    # The same data and seed give the same candidate; the current model (the first run's)
    # is scored on the evaluation samples it was judged on (numpy vs torch: 1e-4).
    assert forced.current_metrics["roc_auc"] == pytest.approx(
        first.candidate_metrics["roc_auc"], abs=1e-4
    )
    assert forced.current_metrics["samples"] == first.data["samples"]["evaluation"]["samples"]


def test_censored_requests_are_dropped_from_the_evaluation_and_counted(first_run) -> None:
    """On the project's JSONL, which carries the completion times to check labels against."""
    requests, _, outcome = first_run("lpc")
    # Labels computed here from the written trace, independently of the job.
    end_s = max(r.arrival_s for r in requests)
    cut_s = two_utc_days_start_s() + DAY_S
    later: dict[int, list[float]] = {}
    for r in requests:
        later.setdefault(r.conversation, []).append(r.arrival_s)
    positives = negatives = censored = 0
    for r in requests:
        if r.arrival_s < cut_s:
            continue
        nexts = [a for a in later[r.conversation] if a > r.arrival_s]
        if nexts:
            positives += min(nexts) - r.completion_s <= HORIZON_S
            negatives += min(nexts) - r.completion_s > HORIZON_S
        elif r.completion_s + HORIZON_S > end_s:
            censored += 1  # cannot be called "ended": dropped
        else:
            negatives += 1
    evaluation = outcome.data["samples"]["evaluation"]
    assert censored >= 30  # the late single requests at least
    assert evaluation["censored"] == censored
    assert evaluation["samples"] == positives + negatives
    assert evaluation["samples"] == outcome.data["split"]["eval_requests"] - censored
    assert evaluation["positive_rate"] == pytest.approx(positives / (positives + negatives))


def test_keeps_the_current_model_when_the_candidate_is_worse(tmp_path: Path) -> None:
    """The current model learnt today's rule; the candidate's training part (yesterday)
    followed the opposite one, so on today's traffic it is worse and is kept out."""
    registry = tmp_path / "registry"
    write_mooncake(tmp_path / "before" / "a.jsonl", chats(HOURS_4_S, 150, seed=2))
    first = retrain(tmp_path / "before", registry)
    assert first.status == PROMOTED, first.reason

    shifted = chats(HOURS_4_S, 150, seed=3, flipped_before_s=HOURS_4_S / 2)
    write_mooncake(tmp_path / "after" / "b.jsonl", shifted)
    second = retrain(tmp_path / "after", registry)
    assert (second.status, second.exit_code) == (KEPT, 3), second.reason
    assert second.reason.startswith("worse: candidate roc_auc")
    assert second.candidate_metrics["roc_auc"] < second.current_metrics["roc_auc"] - 0.2
    store = ModelRegistry(registry)
    assert store.current_version() == first.version  # untouched
    assert store.versions() == [first.version, second.version]  # the candidate is recorded
    assert [e["status"] for e in store.history()] == [PROMOTED, KEPT]


def test_a_text_model_as_current_is_reported_and_the_candidate_promoted(tmp_path: Path):
    """Trace files hold no text: a current text model cannot be scored on them. As on the
    request-log path, that promotes the candidate, saying why."""
    from predictor.artifact import load_artifact
    from tests.predictor.conftest import make_artifact

    make_artifact(tmp_path / "text-model")
    text = load_artifact(tmp_path / "text-model")
    store = ModelRegistry(tmp_path / "registry")
    store.promote(store.publish(text.model, text.metadata))
    write_bailian(tmp_path / "logs" / "t.jsonl", chats(HOURS_4_S, 150, seed=4))
    outcome = retrain(tmp_path / "logs", tmp_path / "registry")
    assert (outcome.status, outcome.current_version) == (PROMOTED, "v0002"), outcome.reason
    assert outcome.reason.startswith("the current model cannot be used")
    assert "not an access-only model" in outcome.reason
    assert outcome.current_metrics is None


def test_a_held_lock_stops_a_second_run(tmp_path: Path, capsys) -> None:
    write_mooncake(tmp_path / "logs" / "t.jsonl", chats(HOURS_4_S, 50, seed=5))
    store = ModelRegistry(tmp_path / "registry")
    with store.lock():
        code, outcome = cli(tmp_path / "logs", tmp_path / "registry", capsys, "--json")
    assert (code, outcome["status"]) == (5, LOCKED)
    assert "another" in outcome["reason"] or "lock" in outcome["reason"]
    assert store.versions() == [] and store.history() == []


def _two_mooncake_files(folder: Path, break_line: Callable[[str], str] | None = None) -> Path:
    """One trace in two files on one clock; `break_line` rewrites the second file's line 2."""
    requests = chats(HOURS_4_S, 60, seed=6)
    half = len(requests) // 2
    write_mooncake(folder / "part-2025-06-01.jsonl", requests[:half])
    second = write_mooncake(folder / "part-2025-06-02.jsonl", requests[half:])
    if break_line is not None:
        lines = second.read_text().splitlines()
        lines[1] = break_line(lines[1])
        second.write_text("\n".join(lines) + "\n")
    return second


def _negative_input_length(line: str) -> str:
    return json.dumps({**json.loads(line), "input_length": -5})


@pytest.mark.parametrize(
    ("break_line", "message"),
    [
        (lambda line: line[:-3], r"part-2025-06-02\.jsonl:2: not valid JSON"),
        (
            _negative_input_length,
            r"part-2025-06-02\.jsonl:2: 'input_length' must be an int >= 1, got -5",
        ),
    ],
    ids=["corrupt-json", "bad-field"],
)
def test_a_bad_line_names_its_file_and_line_and_exits_2(
    tmp_path: Path, capsys, break_line: Callable[[str], str], message: str
) -> None:
    _two_mooncake_files(tmp_path / "logs", break_line)
    registry = tmp_path / "registry"
    code, err = cli(tmp_path / "logs", registry, capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("lpc retrain: error: ")
    assert f"{tmp_path / 'logs'}/" in err  # the real file, not a temporary copy
    assert re.search(message, err), err
    store = ModelRegistry(registry)
    assert store.versions() == [] and store.current_version() is None
    assert store.history()[-1]["status"] == BAD_INPUT  # recorded; the files stay new
    assert store.state().get("seen_files", []) == []

    code, outcome = cli(tmp_path / "logs", registry, capsys, "--json")
    assert (code, outcome["status"], outcome["exit_code"]) == (2, BAD_INPUT, 2)


def test_errors_in_combined_files_name_the_real_file(tmp_path: Path) -> None:
    """Several files are read through a temporary folder or file; errors never name it."""
    from lpc.traces.jsonl import TraceError
    from tests.training.trace_logs import write_lpc

    requests = chats(HOURS_4_S, 30, seed=9)
    options = TraceOptions(horizon_s=HORIZON_S)
    write_lpc(tmp_path / "lpc" / "a.jsonl", requests[:20])
    second = write_lpc(tmp_path / "lpc" / "b.jsonl", requests[20:])
    lines = second.read_text().splitlines()
    lines[2] = json.dumps({**json.loads(lines[2]), "completion_s": -1})
    second.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=rf"^{re.escape(str(second))}:3: 'completion_s'"):
        load_trace_files(sorted((tmp_path / "lpc").iterdir()), "lpc", options)

    write_bailian(tmp_path / "bailian" / "a.jsonl", requests[:20])
    again = write_bailian(tmp_path / "bailian" / "b.jsonl", requests[:25])  # 20 repeated
    first = tmp_path / "bailian" / "a.jsonl"
    with pytest.raises(TraceError, match=rf"^{re.escape(str(again))}:1: 'chat_id' .* {first}"):
        load_trace_files([first, again], "bailian", options)


def test_a_folder_mixing_conversation_and_trace_files_is_refused(tmp_path: Path, capsys):
    logs = tmp_path / "logs"
    write_openai_jsonl(logs / "chats-2025-06-01.jsonl", synthetic_conversations(20, seed=1))
    write_mooncake(logs / "trace-2025-06-01.jsonl", chats(HOURS_4_S, 20, seed=1))
    code, err = cli(logs, tmp_path / "registry", capsys)
    assert code == 2
    assert "mixes conversation files and trace files" in err
    assert "chats-2025-06-01.jsonl" in err and "trace-2025-06-01.jsonl" in err


def test_a_folder_mixing_trace_formats_is_refused(tmp_path: Path, capsys):
    logs = tmp_path / "logs"
    write_bailian(logs / "b.jsonl", chats(HOURS_4_S, 20, seed=1))
    write_mooncake(logs / "m.jsonl", chats(HOURS_4_S, 20, seed=1))
    code, err = cli(logs, tmp_path / "registry", capsys)
    assert code == 2 and "mixes trace formats" in err
    assert "b.jsonl (bailian)" in err and "m.jsonl (mooncake)" in err


def test_mooncake_files_are_read_as_one_trace_on_one_clock(tmp_path: Path, capsys):
    requests = chats(HOURS_4_S, 60, seed=6)
    whole = write_mooncake(tmp_path / "whole.jsonl", requests)
    _two_mooncake_files(tmp_path / "parts")
    options = TraceOptions(horizon_s=HORIZON_S)
    one = load_trace_files([whole], "mooncake", options)
    parts = load_trace_files(sorted((tmp_path / "parts").iterdir()), "mooncake", options)
    assert parts.info["files"] == 2
    assert [r.arrival_s for r in parts.requests] == [r.arrival_s for r in one.requests]
    # Conversations span the files: prefix linkage runs over the trace as a whole.
    assert [r.conversation_id for r in parts.requests] == [r.conversation_id for r in one.requests]

    restarted = tmp_path / "restarted"
    write_mooncake(restarted / "day-2025-06-01.jsonl", requests)
    write_mooncake(restarted / "day-2025-06-02.jsonl", requests)  # ms from 0 again
    code, err = cli(restarted, tmp_path / "registry", capsys)
    assert code == 2 and "day-2025-06-02.jsonl:1: 'timestamp'" in err
    assert "one clock" in err


def test_the_cli_passes_split_at_and_hidden_to_the_trace_path(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The access half at the CLI's default fit (--hidden aside); the return half short."""
    from training.return_distil import HAZARD_TEACHER_PARAMS

    write_mooncake(tmp_path / "logs" / "t.jsonl", chats(HOURS_4_S, 80, seed=8))
    # a short return-model fit (its teacher at 40 boosting rounds instead of 400): its rules
    # are tests/training/test_retrain_return_model.py's
    monkeypatch.setitem(HAZARD_TEACHER_PARAMS, "max_iter", 40)
    extra = ("--json", "--split-at", "0.6", "--hidden", "8", "--seed", "1")
    extra += ("--return-max-epochs", "3")
    code, outcome = cli(tmp_path / "logs", tmp_path / "registry", capsys, *extra)
    assert (code, outcome["status"]) == (0, PROMOTED), outcome["reason"]
    assert outcome["data"]["split_rule"] == "--split-at 0.6"
    assert outcome["return_model"]["decision"] == PROMOTED, outcome["return_model"]
    model = AccessPredictor.load(tmp_path / "registry" / "current")
    # --hidden sizes each member; the artifact stores the members as one block-diagonal MLP
    assert model.metadata.metrics["member_hidden_sizes"] == [8]
    ensemble = model.metadata.metrics["ensemble"]
    assert model.metadata.mlp_config.hidden_sizes == (8 * ensemble,)


def test_the_split_rule(tmp_path: Path) -> None:
    """Absolute times over two UTC days: the newest day; one day, or relative times: the
    last half; --split-at: as lpc train --trace."""
    options = TraceOptions(horizon_s=HORIZON_S)
    start = two_utc_days_start_s()
    two_days = write_bailian(tmp_path / "a.jsonl", chats(2 * DAY_S, 40, seed=7, start_s=start))
    trace = load_trace_files([two_days], "bailian", options)
    split = time_ordered_split(trace, None)
    assert (split.rule, split.absolute_times) == ("newest UTC day", True)
    assert trace.info["time_origin_s"] + split.split.cut_s == start + DAY_S  # 00:00 UTC

    one_day = write_bailian(tmp_path / "b.jsonl", chats(DAY_S / 2, 40, seed=7, start_s=start))
    split = time_ordered_split(load_trace_files([one_day], "bailian", options), None)
    assert split.rule.endswith("(a single UTC day)") and split.evaluation_day is None

    relative = write_bailian(tmp_path / "c.jsonl", chats(HOURS_4_S, 40, seed=7))
    trace = load_trace_files([relative], "bailian", options)
    split = time_ordered_split(trace, None)
    assert split.rule.endswith("(relative times)") and not split.absolute_times
    span = trace.requests[-1].arrival_s - trace.requests[0].arrival_s
    assert split.split.cut_s == pytest.approx(trace.requests[0].arrival_s + span / 2)
    given = time_ordered_split(trace, 0.8)
    assert given.rule == "--split-at 0.8"
    assert given.split.cut_s == pytest.approx(trace.requests[0].arrival_s + 0.8 * span)


@pytest.mark.slow
def test_the_bundled_mooncake_trace_twice(tmp_path: Path, capsys) -> None:
    """docs/training.md's measured run: the first run promotes, the second (--force) trains
    the same candidates (access and return-time) and scores the current models on the same
    samples."""
    import shutil

    from lpc.traces.load import BUNDLED_TRACES, DATA_DIR

    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(DATA_DIR / BUNDLED_TRACES["mooncake"], logs)
    code, first = cli(logs, tmp_path / "registry", capsys, "--json")
    assert (code, first["status"], first["reason"]) == (0, PROMOTED, "no current model")
    assert first["data"]["trace_format"] == "mooncake" and first["data"]["requests"] == 12_031
    assert first["data"]["samples"]["evaluation"]["censored"] > 0
    code, second = cli(logs, tmp_path / "registry", capsys, "--json", "--force")
    assert (code, second["status"]) == (0, PROMOTED) and second["reason"].startswith("not worse")
    assert second["current_metrics"]["roc_auc"] == pytest.approx(
        first["candidate_metrics"]["roc_auc"], abs=1e-4
    )
    # the return-time model, trained on the same split, as `lpc train-return` at 0.5
    # (docs/results.md: 12 points 5-840 s, the distilled 2x32 student, C 0.680, IBS 0.170)
    returns = first["return_model"]
    assert (returns["decision"], returns["reason"]) == (PROMOTED, "no current return model")
    assert returns["registry"] == str(tmp_path / "registry-return")
    assert returns["candidate_metrics"]["samples"] == 6_425
    assert returns["fit"]["recipe"] == "distilled"
    assert returns["fit"]["grid_points"] == 12 and returns["fit"]["hidden_sizes"] == [32, 32]
    assert returns["candidate_metrics"]["integrated_brier"] == pytest.approx(0.170, abs=0.005)
    assert returns["candidate_metrics"]["concordance"] == pytest.approx(0.680, abs=0.01)
    again = second["return_model"]
    assert again["decision"] == PROMOTED and again["reason"].startswith("not worse")
    assert again["current_metrics"]["integrated_brier"] == pytest.approx(
        returns["candidate_metrics"]["integrated_brier"], abs=1e-6
    )
