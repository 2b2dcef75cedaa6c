"""Load on the real server: concurrent clients, a queue bound that is hit, every answer checked.

The model is the deterministic hashing embedder behind a predictor that sleeps per batch (a
stand-in for embedding time), so answers are compared exactly and the queue fills without
burning CPU. The short run is in the default suite; the acceptance run (64 clients, 30 s) is
marked slow. `scripts/predictor_load_test.py` does the same against `lpc serve` with e5.
"""

from __future__ import annotations

import json
import time

import pytest

from predictor.load_test import LoadTestConfig, run_load_test
from predictor.predictor import Predictor
from predictor.server import ServerConfig, create_app
from tests.predictor.conftest import sample_windows
from tests.predictor.fakes import HashingEmbedder
from tests.predictor.server_harness import running_server


class PacedPredictor(Predictor):
    """A real Predictor that also spends `batch_s` per batch, like an embedder would."""

    batch_s = 0.02

    def predict(self, windows):
        time.sleep(self.batch_s)
        return super().predict(windows)


def load(tiny_artifact, clients: int, duration_s: float, max_queue: int):
    predictor = PacedPredictor.load(tiny_artifact, embedder=HashingEmbedder())
    config = ServerConfig(max_batch=8, max_wait_ms=2.0, max_queue_items=max_queue)
    app = create_app(config, predictor, artifact_path=tiny_artifact)
    windows = sample_windows(200, seed=11)
    expected = Predictor.load(tiny_artifact, embedder=HashingEmbedder()).predict(windows)
    with running_server(app, config) as (url, _):
        report = run_load_test(
            LoadTestConfig(
                url, clients=clients, duration_s=duration_s, overload_backoff_s=0.02, tolerance=0.0
            ),
            windows,
            expected,
        )
    print(json.dumps(report.as_dict(), default=str))  # shown with -rA or -s
    return report


def check(report, clients: int) -> None:
    assert report.lost == 0
    assert report.mismatched == 0 and report.max_abs_error == 0.0
    assert report.transport_errors == 0 and report.other_status == {}
    assert report.answered_ok > clients
    assert report.overloaded_503 > 0  # the bound was reached and answered with 503s
    assert report.requests_sent == report.answered_ok + report.overloaded_503
    assert report.healthy_after and report.health_after["queue_depth"] == 0


def test_short_load_with_overload(tiny_artifact):
    report = load(tiny_artifact, clients=24, duration_s=2.0, max_queue=8)
    check(report, 24)


@pytest.mark.slow
def test_sixty_four_clients_for_thirty_seconds(tiny_artifact):
    report = load(tiny_artifact, clients=64, duration_s=30.0, max_queue=32)
    check(report, 64)
