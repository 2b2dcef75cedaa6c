"""Request metrics as ASGI middleware: every answer is counted, wherever it was decided.

Counting in the middleware rather than in each endpoint means a refusal raised before an
endpoint runs (auth, the body reader, routing) or an exception nobody handled (answered 500 by
Starlette's outermost layer) is counted like any other answer. It is plain ASGI, not
`BaseHTTPMiddleware`: it only watches the `http.response.start` message, so request bodies
still stream to the body reader (which stops reading at the size limit).
"""

from __future__ import annotations

import time
from typing import Any

from predictor.server_metrics import ServerMetrics

ENDPOINT_NAMES = {
    "/v1/predict": "predict",
    "/v1/reload": "reload",
    "/healthz": "healthz",
    "/metrics": "metrics",
}
# requests_total and request_latency_seconds cover the service's endpoints; scrapes of
# /metrics would otherwise count themselves.
SERVICE_ENDPOINTS = frozenset({"predict", "reload", "healthz"})


class RequestMetricsMiddleware:
    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    def _record(self, endpoint: str, status: int, started: float) -> None:
        if endpoint in SERVICE_ENDPOINTS:
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.request_latency.labels(endpoint).observe(time.perf_counter() - started)
        if status >= 400:
            status_class = "5xx" if status >= 500 else "4xx"
            self.metrics.error_responses.labels(endpoint, str(status), status_class).inc()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = ENDPOINT_NAMES.get(scope["path"], "unmatched")
        started = time.perf_counter()
        answered = False

        async def watch(message: dict) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                answered = True
                self._record(endpoint, message["status"], started)
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            if not answered:  # Starlette's outermost layer answers it with a 500
                self.metrics.errors.labels("internal").inc()
                self._record(endpoint, 500, started)
            raise
