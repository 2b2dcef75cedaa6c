"""Prometheus metrics of the prediction server, in a registry owned by one app instance.

A per-app `CollectorRegistry` (not the process-global default) keeps two servers in one
process (tests) from sharing counters. Names are all prefixed `lpc_predictor_`; every name, its
type and its labels: docs/predictor.md, "`GET /healthz`, `GET /metrics`".
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        prefix = "lpc_predictor_"
        self.requests = Counter(
            prefix + "requests",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.error_responses = Counter(
            prefix + "error_responses",
            "4xx and 5xx answers by endpoint, status and status class",
            ["endpoint", "status", "status_class"],
            registry=self.registry,
        )
        self.request_latency = Histogram(
            prefix + "request_latency_seconds",
            "Request latency, arrival to response",
            ["endpoint"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            prefix + "batch_size",
            "Windows per model batch",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.batch_latency = Histogram(
            prefix + "batch_latency_seconds",
            "Model time per batch (embedding + MLP)",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            prefix + "queue_depth", "Windows waiting for a batch", registry=self.registry
        )
        self.expected_wait = Gauge(
            prefix + "expected_wait_seconds",
            "Estimated wait of a request arriving now: the running batch's rest and the "
            "queue, in model time (what admission bounds)",
            registry=self.registry,
        )
        self.predictions = Counter(
            prefix + "predictions", "Windows answered", registry=self.registry
        )
        self.errors = Counter(
            prefix + "errors", "Errors and refusals by kind", ["kind"], registry=self.registry
        )
        self.model_info = Gauge(
            prefix + "model_info",
            "The model being served (value 1)",
            ["embedder_id", "weights_sha256", "artifact", "kind"],
            registry=self.registry,
        )
        self.reloads = Counter(
            prefix + "reloads", "Model swaps by outcome", ["outcome"], registry=self.registry
        )

    def set_model(self, embedder_id: str, weights_sha256: str, artifact: str, kind: str) -> None:
        self.model_info.clear()
        self.model_info.labels(embedder_id, weights_sha256, artifact, kind).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
