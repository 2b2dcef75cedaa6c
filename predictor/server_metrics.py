"""Prometheus metrics of the prediction server, in a registry owned by one app instance.

A per-app `CollectorRegistry` (not the process-global default) keeps two servers in one
process (tests) from sharing counters. Names, all prefixed `lpc_predictor_`:

- `requests_total{endpoint,status}`       HTTP requests by endpoint and status code
- `error_responses_total{endpoint,status,status_class}`  every 4xx/5xx answer, whoever gave
                                          it (auth, body reader, endpoint, an unhandled
                                          exception, routing): `endpoint` is predict,
                                          reload, healthz, metrics or unmatched;
                                          `status_class` 4xx or 5xx
- `request_latency_seconds{endpoint}`     histogram, arrival to response
- `batch_size`                            histogram of windows per model batch
- `batch_latency_seconds`                 histogram of model time per batch
- `queue_depth`                           gauge, windows waiting for a batch
- `predictions_total`                     windows answered
- `errors_total{kind}`                    overloaded, invalid, unauthorized, timeout,
                                          prediction_failed, reload_failed, body_too_large,
                                          forbidden, shutting_down, internal (an unhandled
                                          exception)
- `expected_wait_seconds`                 gauge, the estimated wait of a request arriving
                                          now (what admission bounds; 0 before measured)
- `model_info{embedder_id,weights_sha256,artifact,kind}`  gauge = 1 for the model being
                                          served; `kind` text or access (access-only,
                                          `embedder_id` none)
- `reloads_total{outcome}`                model swaps (ok / failed)
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
