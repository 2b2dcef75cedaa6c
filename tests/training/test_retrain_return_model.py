"""`lpc retrain` on trace files also retrains the return-time model: same split, its own
registry, judged by the integrated Brier score; its failures never touch the access result
or the current return model (training/return_retrain.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lpc.access.log_retrain import TraceLogTrainer, time_ordered_split
from lpc.cli.main import main
from predictor.return_time import PREDICTS, ReturnTimePredictor
from tests.training.test_retrain_traces import HORIZON_S, HOURS_4_S, _no_embedder
from tests.training.trace_logs import chats, write_mooncake
from training import return_retrain
from training.access_fit import AccessFitConfig
from training.model_kinds import KindOutcome
from training.model_registry import ModelRegistry
from training.retrain import NO_NEW_DATA, PROMOTED, RetrainConfig, RetrainOutcome, run_retrain
from training.return_distil import HAZARD_TEACHER_PARAMS
from training.return_fit import ReturnFitConfig
from training.return_retrain import (
    DEFAULT_RETURN_TOLERANCE,
    FAILED,
    KEPT,
    SKIPPED,
    ReturnRetrainConfig,
    SplitHandoff,
    decide_return,
    retrain_return_model,
    score_current_return,
    train_return_candidate,
)

QUICK_RETURN_FIT = ReturnFitConfig(max_epochs=3, patience=2)
# the access half only has to run: one plain member, a few epochs
QUICK_ACCESS_FIT = AccessFitConfig(
    hidden_sizes=(8,), ensemble=1, refit=False, teacher_share=0.0, max_epochs=3, patience=2
)
CONVERSATIONS = 120  # ~200 evaluation releases: enough to judge with a minimum of 100
MIN_SAMPLES = 100


def return_config(root: Path, **kwargs) -> ReturnRetrainConfig:
    return ReturnRetrainConfig(root / "returns", fit=QUICK_RETURN_FIT, **kwargs)


def retrain_returns(root: Path, context, trainer=train_return_candidate) -> KindOutcome:
    """The return half alone, with the job's evaluation minimum of these tests."""
    return retrain_return_model(
        return_config(root), context, lambda m: None, trainer, min_evaluation_samples=MIN_SAMPLES
    )


def run(root: Path, returns: bool = True, force: bool = True, **kwargs) -> RetrainOutcome:
    """One daily run through the Python API, quick fits for both halves."""
    config = RetrainConfig(
        logs_dir=root / "logs",
        registry_dir=root / "registry",
        cache_dir=root / "cache",
        return_model=return_config(root) if returns else None,
        min_evaluation_samples=MIN_SAMPLES,
        force=force,
    )
    trainer = TraceLogTrainer(
        horizon_s=HORIZON_S, fit=QUICK_ACCESS_FIT, min_evaluation_requests=MIN_SAMPLES
    )
    return run_retrain(config, _no_embedder, lambda m: None, log_trainer=trainer, **kwargs)


def returns(root: Path) -> ModelRegistry:
    return ModelRegistry(root / "returns", check=ReturnTimePredictor.load)


@pytest.fixture(scope="module", autouse=True)
def quick_teacher():
    """The return fits' teacher at 40 boosting rounds instead of 400: these tests check the
    return half's plumbing (the split, the registry, the decision), whatever recipe the fit
    serves; the recipe is tests/training/test_return_distil.py's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(HAZARD_TEACHER_PARAMS, "max_iter", 40)
        yield


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> tuple[Path, RetrainOutcome]:
    """A folder with a trace log, after the first daily run (run once for the module)."""
    root = tmp_path_factory.mktemp("first")
    write_mooncake(root / "logs" / "t.jsonl", chats(HOURS_4_S, CONVERSATIONS, seed=2))
    return root, run(root)


@pytest.fixture
def logs(first_run, tmp_path: Path) -> Path:
    """A copy of the first run's folder: logs, the access registry, the return registry."""
    shutil.copytree(first_run[0], tmp_path, symlinks=True, dirs_exist_ok=True)
    return tmp_path


@pytest.fixture(scope="module")
def context(first_run) -> SplitHandoff:
    """The split the job hands the return half, built without an access fit."""
    from lpc.replay.request_table import request_table
    from lpc.traces.files import load_trace_files
    from lpc.traces.load import TraceOptions
    from predictor.access_features import default_feature_names
    from training.access_data import DEFAULT_VALIDATION_FRACTION

    trace = load_trace_files(
        [first_run[0] / "logs" / "t.jsonl"], "mooncake", TraceOptions(horizon_s=HORIZON_S)
    )
    table = request_table(trace.requests, trace.request_types)
    names = tuple(default_feature_names(list(table.columns)))
    cut_s = time_ordered_split(trace, None).split.cut_s
    return SplitHandoff(table, names, cut_s, DEFAULT_VALIDATION_FRACTION)


def test_first_run_promotes_a_return_model_and_a_second_run_judges_against_it(
    first_run, logs: Path
):
    first = first_run[1]
    assert first.status == PROMOTED, first.reason
    section = first.to_dict()["return_model"]
    assert (section["decision"], section["reason"]) == (PROMOTED, "no current return model")
    assert (section["version"], section["current_version"]) == ("v0001", "v0001")
    assert section["metric"] == "integrated_brier" and section["current_metrics"] is None
    metrics = section["candidate_metrics"]
    assert 0 < metrics["integrated_brier"] < 1 and 0.5 < metrics["concordance"] <= 1
    # the same evaluation part as the access candidate: its releases, censored ones included
    access = first.data["samples"]["evaluation"]
    assert metrics["samples"] == access["samples"] + access["censored"]
    model = ReturnTimePredictor.load(logs / "returns" / "current")
    assert model.metadata.predicts == PREDICTS
    assert model.metadata.notes["registry"]["decision"] == PROMOTED
    assert model.metadata.notes["split"] == first.data["split"]
    json.dumps(first.to_dict(), allow_nan=False)  # valid JSON: no NaN anywhere

    second = run(logs)
    again = second.return_model
    assert (again.decision, again.version, again.current_version) == (PROMOTED, "v0002", "v0002")
    assert again.reason.startswith("not worse: candidate IBS")
    # same data and seed: the same candidate, and the current model scored on the same releases
    assert flat(again.current_metrics) == pytest.approx(flat(first.return_model.candidate_metrics))
    store = returns(logs)
    assert [(e["status"], e["compared_with"]) for e in store.history()] == [
        (PROMOTED, None),
        (PROMOTED, "v0001"),
    ]
    assert ModelRegistry(logs / "registry").versions() == ["v0001", "v0002"]  # access apart


def flat(metrics: dict) -> dict:
    return {
        f"{k}.{h}" if isinstance(v, dict) else k: x
        for k, v in metrics.items()
        for h, x in (v.items() if isinstance(v, dict) else [(None, v)])
    }


def _worse_by(margin: float):
    """A trainer whose candidate is the real one with its bias shifted: every release is
    told it almost surely returns at once, which costs it integrated Brier score."""

    def trainer(context, current, fit):
        candidate = train_return_candidate(context, current, fit)
        candidate.biases[-1] = candidate.biases[-1] + margin
        model = ReturnTimePredictor(candidate.metadata, candidate.weights, candidate.biases)
        candidate.metrics = _score(model, context)
        return candidate

    return trainer


def _score(model: ReturnTimePredictor, context) -> dict:
    """Score `model` as the job scores a current model, by saving and reloading it."""
    import tempfile

    from predictor.return_time import save_return_model
    from training.return_data import return_samples
    from training.survival_metrics import censoring_survival

    samples = return_samples(
        context.table, context.feature_names, context.cut_s, context.validation_fraction
    )
    training, evaluation = samples.parts["training"], samples.parts["evaluation"]
    censoring = censoring_survival(training.targets.time_s, training.targets.observed)
    with tempfile.TemporaryDirectory() as folder:
        save_return_model(folder, model.metadata, model.weights, model.biases)
        metrics, problem = score_current_return(Path(folder), context.table, evaluation, censoring)
    assert problem is None
    return metrics


def test_a_candidate_worse_by_more_than_the_tolerance_is_kept_out(logs: Path, context):
    kept = retrain_returns(logs, context, _worse_by(5.0))
    assert (kept.decision, kept.current_version, kept.version) == (KEPT, "v0001", "v0002")
    assert kept.reason.startswith("worse: candidate IBS")
    new, old = kept.candidate_metrics["integrated_brier"], kept.current_metrics["integrated_brier"]
    assert new > old + DEFAULT_RETURN_TOLERANCE
    store = returns(logs)
    assert store.current_version() == "v0001" and store.versions() == ["v0001", "v0002"]
    assert store.history()[-1]["status"] == KEPT


def test_the_return_decision_rule() -> None:
    good = {"integrated_brier": 0.170, "concordance": 0.66}
    at = {"integrated_brier": 0.172, "concordance": 0.65}
    past = {"integrated_brier": 0.1721, "concordance": 0.65}
    assert decide_return(at, good, 0.002, 500, 200).promote  # within the tolerance
    verdict = decide_return(past, good, 0.002, 500, 200)
    assert not verdict.promote and "Δ +0.0021" in verdict.reason
    assert "C 0.6500 vs 0.6600" in verdict.reason
    assert decide_return(past, good, 0.002, 500, 200, "ArtifactCorruptError: x").promote
    assert decide_return(past, None, 0.002, 500, 200).promote
    assert not decide_return(good, past, 0.002, 100, 200).promote  # too few releases
    undefined = {"integrated_brier": None}
    assert not decide_return(undefined, good, 0.002, 500, 200).promote


def test_no_return_model_skips_it(logs: Path) -> None:
    outcome = run(logs, returns=False)
    assert outcome.status == PROMOTED
    assert outcome.return_model.decision == SKIPPED
    assert "--no-return-model" in outcome.return_model.reason
    assert returns(logs).versions() == ["v0001"] and len(returns(logs).history()) == 1


def test_without_a_split_the_return_half_is_skipped_saying_why(tmp_path: Path) -> None:
    """What the job gets from conversation logs: no `SplitHandoff` (no request times)."""
    outcome = retrain_return_model(return_config(tmp_path), None, lambda m: None)
    assert outcome.decision == SKIPPED and "conversation text" in outcome.reason
    assert not (tmp_path / "returns").exists()


@pytest.mark.slow
def test_conversation_logs_skip_the_return_model_saying_why(tmp_path: Path) -> None:
    """End to end on conversation logs (slow: it trains a text model)."""
    from tests.training.test_training_retrain import GOOD, add_log, fake_loader
    from training.embedding_cache import EmbedOptions

    add_log(tmp_path, 1, count=60)
    config = RetrainConfig(
        logs_dir=tmp_path / "logs",
        registry_dir=tmp_path / "registry",
        cache_dir=tmp_path / "cache",
        train=GOOD,
        embed=EmbedOptions(progress=False),
        return_model=ReturnRetrainConfig(tmp_path / "returns"),
        min_evaluation_samples=1,
    )
    outcome = run_retrain(config, fake_loader, lambda m: None)
    assert outcome.status == PROMOTED, outcome.reason
    section = outcome.to_dict()["return_model"]
    assert section["decision"] == SKIPPED and "conversation text" in section["reason"]
    assert not (tmp_path / "returns").exists()


def test_a_failing_return_half_leaves_the_access_result_and_current_return_model(logs: Path):
    before = (logs / "returns" / "current" / "model.safetensors").read_bytes()

    def broken(context, current, fit):
        raise RuntimeError("out of memory while fitting")

    second = run(logs, return_trainer=broken)
    assert (second.status, second.exit_code, second.version) == (PROMOTED, 0, "v0002")
    # the return model has not decided on the files: they stay new for the next run
    assert second.data["files_recorded_as_trained"] is False
    assert ModelRegistry(logs / "registry").state()["last_version"] == "v0001"
    assert ModelRegistry(logs / "registry").current_version() == "v0002"  # access: recorded
    assert second.return_model.decision == FAILED
    assert second.return_model.reason == "RuntimeError: out of memory while fitting"
    assert second.return_model.current_version == "v0001"
    store = returns(logs)
    assert store.current_version() == "v0001" and store.versions() == ["v0001"]
    assert store.history()[-1]["status"] == FAILED
    assert (logs / "returns" / "current" / "model.safetensors").read_bytes() == before


class Killed(BaseException):
    """What a SIGKILL is to the run: it ends there, no handler runs."""


def test_a_run_killed_in_its_return_half_leaves_the_files_new(tmp_path: Path) -> None:
    """Issue 44, case 6: the access half had recorded the files, so the next run found
    nothing new and the return model never learnt from them."""
    write_mooncake(tmp_path / "logs" / "t.jsonl", chats(HOURS_4_S, CONVERSATIONS, seed=2))

    def killed(context, current, fit):
        raise Killed

    with pytest.raises(Killed):
        run(tmp_path, force=False, return_trainer=killed)
    access = ModelRegistry(tmp_path / "registry")
    assert access.current_version() == "v0001"  # the access half was recorded
    assert "seen_files" not in access.state()

    second = run(tmp_path, force=False)  # not "no new log files": the files are still new
    assert second.status == PROMOTED and second.data["files_recorded_as_trained"] is True
    assert (second.return_model.decision, second.return_model.version) == (PROMOTED, "v0001")
    assert access.state()["last_version"] == "v0002"

    third = run(tmp_path, force=False)
    assert (third.status, third.exit_code) == (NO_NEW_DATA, 4)


def test_a_write_killed_half_way_is_never_published(logs: Path, context, monkeypatch) -> None:
    """The artifact is written into a hidden staging folder: a failure half-way leaves the
    current return model and no version; the next run removes the leftovers."""

    def half_written(folder, metadata, weights, biases):
        Path(folder).mkdir(parents=True)
        (Path(folder) / "model.safetensors").write_bytes(b"partial")
        raise OSError("No space left on device")

    monkeypatch.setattr(return_retrain, "save_return_model", half_written)
    second = retrain_returns(logs, context)
    assert second.decision == FAILED and "No space left on device" in second.reason
    store = returns(logs)
    assert store.versions() == ["v0001"] and store.current_version() == "v0001"
    ReturnTimePredictor.load(logs / "returns" / "current")
    assert [p.name for p in (logs / "returns").glob(".incoming-*")]  # the hidden leftover

    monkeypatch.undo()
    third = retrain_returns(logs, context)
    assert third.decision == PROMOTED
    assert not list((logs / "returns").glob(".incoming-*"))
    assert returns(logs).versions() == ["v0001", "v0002"]


@pytest.mark.slow
def test_the_cli_reports_the_return_model_beside_the_access_one(tmp_path: Path, capsys):
    """Text and JSON; the default return registry is the access registry's sibling. (Slow:
    the CLI fits the access model with its full defaults.)"""
    logs = tmp_path
    write_mooncake(logs / "logs" / "t.jsonl", chats(HOURS_4_S, CONVERSATIONS * 2, seed=2))
    base = ["retrain", "--logs", str(logs / "logs"), "--registry", str(logs / "registry")]
    quick = ["--hidden", "8", "--return-max-epochs", "2", "--no-progress"]
    assert main([*base, *quick]) == 0
    out = capsys.readouterr().out
    assert "return model: promoted: no current return model (version v0001" in out
    ReturnTimePredictor.load(logs / "registry-return" / "current")

    code = main([*base, *quick, "--force", "--json", "--no-return-model"])
    outcome = json.loads(capsys.readouterr().out)
    assert (code, outcome["return_model"]["decision"]) == (0, SKIPPED)
    assert ModelRegistry(logs / "registry-return").versions() == ["v0001"]

    code = main([*base, "--return-registry", str(logs / "registry"), "--force"])
    assert code == 2 and "is the access registry" in capsys.readouterr().err


def test_the_default_return_registry_is_the_access_registrys_sibling(monkeypatch) -> None:
    from training.locations import RETURN_REGISTRY_DIR_ENV, default_return_registry_dir

    monkeypatch.delenv(RETURN_REGISTRY_DIR_ENV, raising=False)
    assert default_return_registry_dir(Path("/m/registry")) == Path("/m/registry-return")
    monkeypatch.setenv(RETURN_REGISTRY_DIR_ENV, "/srv/returns")
    assert default_return_registry_dir(Path("/m/registry")) == Path("/srv/returns")


def test_the_cli_default_tolerance_is_the_module_default() -> None:
    import argparse

    from lpc.cli import retrain

    parser = argparse.ArgumentParser()
    retrain.register(parser.add_subparsers())
    args = parser.parse_args(["retrain", "--logs", "x"])
    assert args.return_tolerance == DEFAULT_RETURN_TOLERANCE
