"""`lpc retrain --logs DIR` on the serving engine's request logs: an access-only candidate
fitted on the days before the newest, judged with the current model on the newest day."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from lpc.cli.main import main
from lpc.integrations.request_log import RequestLogConfig, RequestLogWriter
from lpc.replay.policies import parse_policy
from lpc.replay.simulator import prepare, replay
from lpc.workload import ScriptedTurn, WorkloadRequest, compact_tokens
from predictor.access_predictor import AccessPredictor

DAY_S = 86_400.0


def two_days_of_chats(start_s: float, conversations: int = 700, seed: int = 3):
    """Chats over two UTC days; think times are short (a user still typing) or long (gone
    for a while), so a 180 s horizon has both labels."""
    rng = random.Random(seed)
    requests = []
    for c in range(conversations):
        t = start_s + rng.uniform(0, 2 * DAY_S - 7200)
        history: list[int] = []
        patient = rng.random() < 0.5
        turns = rng.randint(1, 8)
        for k in range(turns):
            prompt = history + [rng.randrange(5000) for _ in range(rng.randint(10, 60))]
            output = [rng.randrange(5000) for _ in range(rng.randint(10, 60))]
            turn = ScriptedTurn(f"c{c}", k, compact_tokens(prompt + output), len(prompt), False)
            done = t + rng.uniform(1, 10)
            requests.append(WorkloadRequest(f"c{c}#{k}", turn, t, done))
            t = done + rng.expovariate(1 / (40 if patient else 1500))
            history = prompt + output
    requests.sort(key=lambda r: r.arrival_s)
    return [r for r in requests if r.completion_s < start_s + 2 * DAY_S]  # two days exactly


@pytest.fixture(scope="module")
def request_logs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("request-logs")
    day_start = (time.time() // DAY_S - 2) * DAY_S  # the day before yesterday, 00:00 UTC
    requests = two_days_of_chats(day_start)
    writer = RequestLogWriter(RequestLogConfig(folder, salt="test"))
    workload = prepare(requests, 16, {})
    replay(workload, parse_policy("lru"), 50_000, request_log=writer)
    writer.close()
    assert writer.counters.snapshot()["records_written"] == len(requests)
    return folder


def retrain(logs: Path, registry: Path, capsys, *extra: str) -> tuple[int, dict]:
    """The access model's daily job on request logs; the return-time half, which has its own
    tests (test_retrain_return_model.py), is left out to keep these fast."""
    args = ["--logs", str(logs), "--registry", str(registry), "--json", "--no-return-model"]
    code = main(["retrain", *args, *extra])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.slow  # two trainings each (about 16 s together): CI step 1b
def test_retrain_trains_on_request_logs_and_judges_on_the_newest_day(
    request_logs: Path, tmp_path: Path, capsys
) -> None:
    registry = tmp_path / "registry"
    days = sorted({p.name[9:19] for p in request_logs.glob("requests-*.jsonl")})
    assert len(days) >= 2

    code, first = retrain(request_logs, registry, capsys)
    assert code == 0 and first["status"] == "promoted", first
    assert first["reason"] == "no current model"
    assert first["data"]["evaluation_day"] == days[-1]
    samples = first["data"]["samples"]
    assert samples["evaluation"]["samples"] > 200 and samples["fit"]["samples"] > 200
    assert 0 < samples["evaluation"]["positive_rate"] < 1
    assert first["candidate_metrics"]["roc_auc"] > 0.6  # think-time features separate them
    model = AccessPredictor.load(registry / "current")  # an access-only artifact, no text
    assert "think_time_s" in " ".join(model.feature_names)

    code, again = retrain(request_logs, registry, capsys)
    assert code == 4 and again["status"] == "no_new_data"

    code, forced = retrain(request_logs, registry, capsys, "--force")
    assert forced["status"] in ("promoted", "kept")
    assert forced["current_metrics"]["roc_auc"] == pytest.approx(
        first["candidate_metrics"]["roc_auc"], abs=1e-4
    )  # the current model scored on the newest-day samples it was judged on (numpy vs torch)
    assert forced["reason"].startswith(("not worse", "worse"))


@pytest.mark.slow  # two trainings each (about 16 s together): CI step 1b
def test_a_promotion_reloads_a_running_server_holding_an_access_model(
    request_logs: Path, tmp_path: Path, capsys
) -> None:
    """`lpc retrain --logs --notify-url` reaches a running `lpc serve` that holds the current
    access-only model: it swaps in the promoted version and answers with it."""

    from predictor.access_features import ConversationState, RequestState, feature_row
    from predictor.server import ServerConfig, create_app
    from tests.predictor import server_harness as loopback
    from tests.predictor.server_harness import running_server

    registry = tmp_path / "registry"
    code, first = retrain(request_logs, registry, capsys)
    assert code == 0 and first["status"] == "promoted", first
    served = AccessPredictor.load(registry / "current")
    config = ServerConfig(model_root=registry)
    app = create_app(config, served, artifact_path=registry / "current")
    names = served.feature_names
    request, conversation = RequestState(1000.0, 300, 120, 60), ConversationState()
    values = feature_row(names, request, conversation)
    item = {"conversation_id": "c", "access_features": dict(zip(names, values, strict=True))}

    with running_server(app, config) as (url, _):
        before = loopback.get(f"{url}/healthz").json()["model"]
        code, second = retrain(
            request_logs,
            registry,
            capsys,
            *("--force", "--seed", "1", "--tolerance", "0.5", "--notify-url", url),
        )
        after = loopback.get(f"{url}/healthz").json()["model"]
        answer = loopback.post(f"{url}/v1/predict", json={"items": [item]}).json()

    assert code == 0 and second["status"] == "promoted", second
    assert second["notified"] is True and second["version"] != first["version"]
    promoted = AccessPredictor.load(registry / second["version"])
    assert before["kind"] == after["kind"] == "access"
    assert after["generation"] == before["generation"] + 1
    assert after["weights_sha256"] == promoted.metadata.weights_sha256
    assert after["weights_sha256"] != before["weights_sha256"]
    assert answer["probabilities"] == [promoted.predict_one(request, conversation)]
