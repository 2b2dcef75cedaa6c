"""The daily job runs its model kinds as plug-ins (training/model_kinds.py): any follower kind
gets the same publishing, history and file bookkeeping as the return-time model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.training.test_training_retrain import add_log, config, retrain
from training.model_kinds import (
    FAILED,
    KEPT,
    PROMOTED,
    KindCandidate,
    KindOutcome,
    publish_and_record,
    run_follower,
)
from training.model_registry import ModelRegistry, registry_record
from training.promotion import Decision
from training.retrain import run_retrain


def _load_score(path: Path) -> dict[str, Any]:
    return json.loads((path / "score.json").read_text(encoding="utf-8"))


@dataclass
class ScoreKind:
    """A toy model kind: its 'model' is a score, promoted when not lower than the current."""

    root: Path
    score: float
    section: str = "toy_model"
    name: str = "toy model"
    describe: str = "the toy model"
    label: str = "toy registry"
    metric: str = "score"
    tolerance: float = 0.0
    keep_versions: int = 2
    fail: bool = False
    handed: list[Any] = field(default_factory=list)

    @property
    def registry(self) -> ModelRegistry:
        return ModelRegistry(self.root, check=_load_score)

    def skip_reason(self, handoff: Any) -> str | None:
        return None

    def train(self, handoff: Any, log: Any) -> KindCandidate:
        self.handed.append(handoff)
        if self.fail:
            raise RuntimeError("toy training failed")
        current = self.registry.current_path()
        return KindCandidate(
            {"score": self.score},
            1,
            None if current is None else {"score": _load_score(current)["score"]},
        )

    def decide(self, candidate: KindCandidate) -> Decision:
        current = candidate.current_metrics
        promote = current is None or candidate.metrics["score"] >= current["score"]
        return Decision(promote, "better" if promote else "worse")

    def publish(self, candidate: KindCandidate, registry_notes: dict[str, Any]) -> str:
        document = {**candidate.metrics, "registry": registry_record(registry_notes)}
        return self.registry.publish_folder(
            lambda folder: (
                folder.mkdir(parents=True),
                (folder / "score.json").write_text(json.dumps(document), encoding="utf-8"),
            )
        )

    def history_extra(self) -> dict[str, Any]:
        return {"toy": True}

    def outcome_fit(self, candidate: KindCandidate) -> dict[str, Any]:
        return {"score": candidate.metrics["score"]}


def test_publish_and_record_publishes_a_kept_candidate_without_promoting_it(tmp_path: Path):
    kind = ScoreKind(tmp_path / "toy", score=0.5)
    first, v1 = publish_and_record(kind, kind.train(None, print), None, print)
    kind.score = 0.2
    second, v2 = publish_and_record(kind, kind.train(None, print), v1, print)
    assert (first.promote, second.promote, v1, v2) == (True, False, "v0001", "v0002")
    registry = kind.registry
    assert registry.current_version() == "v0001"  # the kept one is published, not current
    notes = _load_score(registry.path_of("v0002"))["registry"]
    assert (notes["decision"], notes["compared_with"], notes["metric"]) == (KEPT, "v0001", "score")
    assert notes["current_metrics"] == {"score": 0.5}
    history = registry.history()
    assert [h["status"] for h in history] == [PROMOTED, KEPT]
    assert history[-1]["toy"] is True and history[-1]["candidate_metrics"] == {"score": 0.2}


def test_a_follower_kind_runs_under_its_own_lock_and_reports_its_section(tmp_path: Path):
    kind = ScoreKind(tmp_path / "toy", score=0.5)
    with kind.registry.lock():  # another run holds the toy registry
        locked = run_follower(kind, "split", lambda m: None)
    assert (locked.decision, locked.files_decided, kind.handed) == ("locked", False, [])
    outcome = run_follower(kind, "split", lambda m: None)
    assert isinstance(outcome, KindOutcome) and kind.handed == ["split"]
    section = outcome.to_dict()
    assert (section["decision"], section["metric"], section["version"]) == (
        PROMOTED,
        "score",
        "v0001",
    )
    assert section["fit"] == {"score": 0.5} and section["registry"] == str(tmp_path / "toy")


def test_the_job_runs_every_follower_and_keeps_the_files_new_when_one_fails(tmp_path: Path):
    add_log(tmp_path, 1)
    good = ScoreKind(tmp_path / "good", score=0.5)
    broken = ScoreKind(tmp_path / "broken", score=0.5, section="broken_model", fail=True)
    outcome = retrain_with(tmp_path, [good, broken])
    assert (outcome.status, outcome.exit_code) == (PROMOTED, 0), outcome.reason
    report = outcome.to_dict()
    assert report["return_model"] is None  # not among this run's kinds
    assert report["toy_model"]["decision"] == PROMOTED
    assert report["broken_model"]["decision"] == FAILED
    assert report["broken_model"]["reason"] == "RuntimeError: toy training failed"
    assert good.handed == [None]  # conversation logs hand on no split
    # the broken kind has not decided on the files: they stay new for the next run
    assert outcome.data["files_recorded_as_trained"] is False
    assert ModelRegistry(tmp_path / "registry").state() == {}
    assert ModelRegistry(tmp_path / "broken").history()[-1]["status"] == FAILED

    broken.fail = False
    again = retrain_with(tmp_path, [good, broken])  # not forced: the files are still new
    assert again.status == PROMOTED, again.reason
    assert again.data["files_recorded_as_trained"] is True
    assert ModelRegistry(tmp_path / "registry").state()["last_version"] == again.version
    assert retrain(config(tmp_path, return_model=None)).status == "no_new_data"


def retrain_with(tmp_path: Path, followers: list[ScoreKind]):
    from tests.training.test_training_retrain import NOW, fake_loader

    return run_retrain(
        config(tmp_path, min_evaluation_samples=1),
        fake_loader,
        lambda m: None,
        now=NOW,
        followers=followers,
    )
