"""Load on the real server: concurrent clients, a queue bound that is hit, every answer checked.

The model is the deterministic hashing embedder behind a predictor that sleeps per batch (a
stand-in for embedding time), so answers are compared exactly and the queue fills without
burning CPU. Every run here is marked slow: its pass leans on wall-clock time (CI step 1b runs
them); the default suite checks the same rules by counting (test_predictor_batching.py). `scripts/predictor_load_test.py` does the same against `lpc serve` with e5.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from lpc.benchmarks.load_test import LoadTestConfig, run_load_test
from predictor.features import ConversationWindow
from predictor.predictor import Predictor
from predictor.server import ServerConfig, create_app
from tests.predictor import server_harness as loopback
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


# Wall-clock runs whose outcome leans on the machine's speed: out of the default suite, where
# tests/predictor/test_predictor_batching.py checks the queue bound and admission by work by
# counting, and test_predictor_server.py the server's 503s under concurrent clients.
@pytest.mark.slow
def test_short_load_with_overload(tiny_artifact):
    report = load(tiny_artifact, clients=24, duration_s=2.0, max_queue=8)
    check(report, 24)


@pytest.mark.slow
def test_sixty_four_clients_for_thirty_seconds(tiny_artifact):
    report = load(tiny_artifact, clients=64, duration_s=30.0, max_queue=32)
    check(report, 64)


# -- admission by work: mixed request sizes ------------------------------------------------
class TokenPacedEmbedder(HashingEmbedder):
    """The hashing embedder (answers exact and deterministic) that also spends
    `seconds_per_token` for every token it is fed, as a transformer's time grows with its
    input: a 512-token window costs fifty times a first turn of a few words."""

    def __init__(self, seconds_per_token: float) -> None:
        super().__init__()
        self.seconds_per_token = seconds_per_token

    def embed(self, texts, batch_size: int = 32):
        time.sleep(self.seconds_per_token * sum(self.tokenizer.count_input_tokens(texts)))
        return super().embed(texts, batch_size)


def long_windows(n: int, seed: int = 0) -> list[ConversationWindow]:
    """Five prompts of 300 words each: every window fills the 512-token budget."""
    rng = np.random.default_rng(seed)
    vocabulary = ["cache", "prefix", "block", "eviction", "window", "token", "model", "why"]
    return [
        ConversationWindow(
            f"long-{seed}-{i}",
            tuple(" ".join(rng.choice(vocabulary, size=300)) for _ in range(5)),
            5 + i % 7,
        )
        for i in range(n)
    ]


def mixed_load(tiny_artifact, clients: int, long_s: float, request_timeout_s: float):
    """Learn the model's speed on short single-window requests, then send bursts of 1-8
    long windows per request: the load where counting windows let a wait past the timeout
    in. Returns (short phase report, long phase report)."""
    predictor = Predictor.load(tiny_artifact, embedder=TokenPacedEmbedder(30e-6))
    config = ServerConfig(max_batch=8, request_timeout_s=request_timeout_s)
    app = create_app(config, predictor, artifact_path=tiny_artifact)
    reference = Predictor.load(tiny_artifact, embedder=HashingEmbedder())
    short, long = sample_windows(200, seed=12), long_windows(64, seed=13)
    with running_server(app, config) as (url, _):
        phases = []
        for windows, duration_s, clients_now, largest in (
            (short, 1.0, 16, 1),
            (long, long_s, clients, 8),
        ):
            report = run_load_test(
                LoadTestConfig(
                    url,
                    clients=clients_now,
                    duration_s=duration_s,
                    max_items_per_request=largest,
                    overload_backoff_s=0.02,
                    tolerance=0.0,
                ),
                windows,
                reference.predict(windows),
            )
            print(json.dumps(report.as_dict(), default=str))  # shown with -rA or -s
            phases.append(report)
        metrics = loopback.get(url + "/metrics").text
    return phases[0], phases[1], metrics


def check_mixed(short, long, metrics: str) -> None:
    assert short.passed and short.answered_ok > 0
    assert long.lost == 0 and long.mismatched == 0 and long.transport_errors == 0
    assert long.other_status == {}, long.other_status  # no 504: overload was refused at once
    assert long.answered_ok > 0 and long.overloaded_503 > 0
    assert long.healthy_after and long.health_after["queue_depth"] == 0
    assert 'lpc_predictor_errors_total{kind="timeout"}' not in metrics


@pytest.mark.slow
def test_mixed_sizes_overload_is_refused_at_once_never_timed_out(tiny_artifact):
    short, long, metrics = mixed_load(tiny_artifact, clients=64, long_s=2.5, request_timeout_s=2.0)
    check_mixed(short, long, metrics)


@pytest.mark.slow
def test_mixed_sizes_sixty_four_clients_for_thirty_seconds(tiny_artifact):
    short, long, metrics = mixed_load(tiny_artifact, clients=64, long_s=30.0, request_timeout_s=5.0)
    check_mixed(short, long, metrics)
