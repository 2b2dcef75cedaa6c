"""`lpc serve`: the batched prediction RPC beside inference (FastAPI + uvicorn).

Endpoints: `POST /v1/predict`, `POST /v1/reload`, `GET /healthz`, `GET /metrics`. See
docs/predictor.md for the JSON, the status codes and the metric names.

Why it is shaped this way:
- The inference engine asks once per user request and must never wait on us, so every
  request is answered quickly: a probability, or an explicit refusal (503 overloaded, 422
  invalid) the client turns into its fallback probability.
- Requests from several inference instances are micro-batched (batching.py): one embedding
  call per batch is what makes CPU serving affordable.
- A retraining job promotes a new artifact without a restart: `POST /v1/reload` loads it
  beside the running model (requests keep flowing) and swaps it in between two batches.
- A model trained with finish features is served only if every one of them can be computed
  from the request (`predictor.request_features`: `prompt_tokens`, the current prompt);
  otherwise it is refused when the server starts or the reload is asked for, never per request.
- Binds 127.0.0.1 unless told otherwise; a bearer token can be required for /v1/*.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request, Response
from pydantic import ValidationError

from predictor.artifact import ArtifactError, load_artifact
from predictor.batching import (
    BatcherStoppedError,
    BatchRecord,
    MicroBatcher,
    PredictFn,
    QueueFullError,
)
from predictor.features import ConversationWindow
from predictor.predictor import Predictor
from predictor.request_features import check_servable, windows_without_prompt_tokens
from predictor.rpc_schema import (
    ReloadRequest,
    RequestLimits,
    missing_prompt_tokens_details,
    request_model,
    validation_details,
)
from predictor.server_metrics import ServerMetrics

DEFAULT_PORT = 8476


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_batch: int = 32
    max_wait_ms: float = 0.0
    max_queue_items: int = 256
    request_timeout_s: float = 30.0
    graceful_timeout_s: float = 30.0
    token: str | None = field(default=None, repr=False)
    limits: RequestLimits = field(default_factory=RequestLimits)
    model_root: Path | None = None  # reloads may only load artifacts under this folder

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"ServerConfig.{name} {why}, got {getattr(self, name)!r}")

        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise bad("port", "must be an integer in [0, 65535]")
        for name in ("max_batch", "max_queue_items"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(name, "must be a positive integer")
        for name in ("max_wait_ms", "request_timeout_s", "graceful_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 <= value < float("inf"):
                raise bad(name, "must be a finite number >= 0")
        if self.request_timeout_s == 0:
            raise bad("request_timeout_s", "must be > 0")
        if self.token is not None and len(self.token) < 8:
            raise ValueError("ServerConfig.token must be at least 8 characters")


class ModelSlot:
    """The predictor in service. Reading `current` is atomic; `swap` replaces it for the next
    batch, so the model changes between batches and never inside one."""

    def __init__(self, predictor: Predictor, artifact_path: Path | None) -> None:
        self._lock = threading.Lock()
        self._predictor = predictor
        self.artifact_path = artifact_path
        self.generation = 1

    @property
    def current(self) -> Predictor:
        return self._predictor

    def swap(self, predictor: Predictor, artifact_path: Path | None) -> int:
        with self._lock:
            self._predictor = predictor
            self.artifact_path = artifact_path
            self.generation += 1
            return self.generation

    def describe(self) -> dict[str, Any]:
        predictor = self._predictor
        metadata = predictor.artifact.metadata
        return {
            "generation": self.generation,
            "artifact": str(self.artifact_path) if self.artifact_path else None,
            "embedder_id": predictor.embedder_id,
            "weights_sha256": metadata.weights_sha256,
            "base_rate": metadata.base_rate,
            "feature_fingerprint": metadata.feature_config.fingerprint(),
            "created_at": metadata.created_at,
            "extra_features": list(predictor.extra_features),
            # What prompt_tokens must be counted with, for a model that reads them.
            "serving_tokenizer": metadata.notes.get("serving_tokenizer"),
        }


def batch_predict(predictor: Predictor) -> PredictFn:
    """`predictor.predict` for one batch, tolerant of windows queued for another model.

    Requests are checked against the model in service when they arrive. A model swapped in
    while they wait may need `prompt_tokens` some of them lack; rather than failing the whole
    batch (and every other caller in it), those windows get NaN, which the endpoint answers
    with the same 422 an arriving request gets. Rows are independent (row-wise MLP), so the
    others get exactly what `predict` alone gives."""
    if not predictor.needs_prompt_tokens:
        return predictor.predict

    def predict(windows: Sequence[ConversationWindow]) -> np.ndarray:
        missing = set(windows_without_prompt_tokens(windows))
        if not missing:
            return predictor.predict(windows)
        out = np.full(len(windows), np.nan)
        kept = [i for i in range(len(windows)) if i not in missing]
        if kept:
            out[kept] = predictor.predict([windows[i] for i in kept])
        return out

    return predict


def load_for_reload(path: Path, current: Predictor) -> Predictor:
    """The predictor for a promoted artifact, reusing the running embedder when it matches
    (and refusing an artifact the server cannot serve before loading any embedder for it)."""
    artifact = load_artifact(path)
    check_servable(artifact.metadata.mlp_config.extra_features, f"artifact {path}")
    if artifact.metadata.embedder_id == current.embedder_id:
        return Predictor(artifact, current.embedder, current.embed_batch_size)
    return Predictor.load(path, embed_batch_size=current.embed_batch_size)


def _json(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(payload, allow_nan=False),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def create_app(
    config: ServerConfig,
    predictor: Predictor,
    artifact_path: Path | None = None,
    reload_loader: Callable[[Path, Predictor], Predictor] = load_for_reload,
) -> FastAPI:
    """The FastAPI app serving `predictor` (`artifact_path` is what a bare reload reloads).

    Raises `UnservableFeaturesError` (a ValueError) for a model whose finish features a
    prediction request cannot carry."""
    predictor.check_servable()
    metrics = ServerMetrics()
    slot = ModelSlot(predictor, artifact_path)
    PredictRequest = request_model(config.limits)
    model_root = config.model_root or (artifact_path.parent if artifact_path else None)
    reload_lock = asyncio.Lock()

    def on_batch(record: BatchRecord) -> None:
        metrics.batch_size.observe(record.size)
        metrics.batch_latency.observe(record.seconds)
        metrics.predictions.inc(record.size)

    batcher = MicroBatcher(
        predict=lambda: batch_predict(slot.current),
        max_batch=config.max_batch,
        max_wait_s=config.max_wait_ms / 1000.0,
        max_queue_items=config.max_queue_items,
        on_batch=on_batch,
        on_queue_depth=metrics.queue_depth.set,
        max_expected_wait_s=config.request_timeout_s,
    )

    def publish_model() -> None:
        info = slot.describe()
        metrics.set_model(info["embedder_id"], info["weights_sha256"], info["artifact"] or "")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        publish_model()
        try:
            yield
        finally:
            # uvicorn calls this after in-flight requests finished (or the grace period ended).
            await batcher.stop()

    app = FastAPI(
        title="LPC predictor", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.metrics = metrics
    app.state.slot = slot
    app.state.batcher = batcher

    def finish(
        endpoint: str, started: float, response: Response, error_kind: str | None = None
    ) -> Response:
        metrics.requests.labels(endpoint, str(response.status_code)).inc()
        metrics.request_latency.labels(endpoint).observe(time.perf_counter() - started)
        if error_kind:
            metrics.errors.labels(error_kind).inc()
        return response

    def unauthorized(request: Request) -> Response | None:
        if config.token is None:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, supplied = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            supplied.strip().encode(), config.token.encode()
        ):
            return None
        return _json(
            401, {"detail": "missing or wrong bearer token"}, {"WWW-Authenticate": "Bearer"}
        )

    async def read_json(request: Request, endpoint: str, started: float):
        """The parsed body, or the error Response to send."""
        limit = config.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return None, finish(
                endpoint,
                started,
                _json(413, {"detail": f"body of {declared} bytes exceeds the {limit}-byte limit"}),
                "body_too_large",
            )
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                return None, finish(
                    endpoint,
                    started,
                    _json(413, {"detail": f"body exceeds the {limit}-byte limit"}),
                    "body_too_large",
                )
        try:
            return json.loads(body), None
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            return None, finish(
                endpoint,
                started,
                _json(
                    422,
                    {
                        "detail": [
                            {
                                "loc": ["body"],
                                "msg": f"body is not valid JSON: {error}",
                                "type": "json_invalid",
                            }
                        ]
                    },
                ),
                "invalid",
            )

    @app.post("/v1/predict")
    async def predict(request: Request) -> Response:
        started = time.perf_counter()
        refusal = unauthorized(request)
        if refusal is not None:
            return finish("predict", started, refusal, "unauthorized")
        payload, error = await read_json(request, "predict", started)
        if error is not None:
            return error
        try:
            parsed = PredictRequest.model_validate(payload)
        except ValidationError as invalid:
            return finish(
                "predict",
                started,
                _json(422, {"detail": validation_details(invalid.errors())}),
                "invalid",
            )
        windows = parsed.windows()
        if slot.current.needs_prompt_tokens:
            missing = windows_without_prompt_tokens(windows)
            if missing:
                return finish(
                    "predict",
                    started,
                    _json(422, {"detail": missing_prompt_tokens_details(missing)}),
                    "invalid",
                )
        try:
            pending = batcher.enqueue(windows)
            probabilities = await asyncio.wait_for(pending, timeout=config.request_timeout_s)
        except QueueFullError as full:
            return finish(
                "predict",
                started,
                _json(503, {"detail": "overloaded", "reason": str(full)}, {"Retry-After": "1"}),
                "overloaded",
            )
        except BatcherStoppedError:
            return finish(
                "predict", started, _json(503, {"detail": "shutting down"}), "shutting_down"
            )
        except TimeoutError:
            return finish(
                "predict",
                started,
                _json(504, {"detail": f"no answer within {config.request_timeout_s} s"}),
                "timeout",
            )
        except Exception as failure:  # a failed batch: report it, keep serving
            return finish(
                "predict",
                started,
                _json(500, {"detail": f"prediction failed: {type(failure).__name__}: {failure}"}),
                "prediction_failed",
            )
        # NaN: a model needing prompt_tokens was swapped in while these waited (batch_predict)
        unanswered = [
            i for i in windows_without_prompt_tokens(windows) if math.isnan(probabilities[i])
        ]
        if unanswered:
            return finish(
                "predict",
                started,
                _json(422, {"detail": missing_prompt_tokens_details(unanswered)}),
                "invalid",
            )
        return finish("predict", started, _json(200, {"probabilities": probabilities.tolist()}))

    @app.post("/v1/reload")
    async def reload(request: Request) -> Response:
        started = time.perf_counter()
        refusal = unauthorized(request)
        if refusal is not None:
            return finish("reload", started, refusal, "unauthorized")
        payload, error = await read_json(request, "reload", started)
        if error is not None:
            return error
        try:
            parsed = ReloadRequest.model_validate(payload if payload is not None else {})
        except ValidationError as invalid:
            return finish(
                "reload",
                started,
                _json(422, {"detail": validation_details(invalid.errors())}),
                "invalid",
            )
        # A bare reload re-reads the path the server started with: typically the registry's
        # "current" link, repointed by a promotion. Links are followed at load time only.
        target = Path(parsed.artifact) if parsed.artifact else artifact_path
        if target is None:
            return finish(
                "reload",
                started,
                _json(422, {"detail": "no artifact given and the server was not started from one"}),
                "invalid",
            )
        if model_root is not None and not target.resolve().is_relative_to(model_root.resolve()):
            return finish(
                "reload",
                started,
                _json(403, {"detail": f"{target} is outside the model root {model_root}"}),
                "forbidden",
            )
        async with reload_lock:
            try:
                fresh = await asyncio.to_thread(reload_loader, target, slot.current)
                fresh.check_servable()
            except (ArtifactError, OSError, ValueError) as failure:
                metrics.reloads.labels("failed").inc()
                return finish(
                    "reload",
                    started,
                    _json(
                        409,
                        {
                            "detail": f"reload failed, still serving generation "
                            f"{slot.generation}: {failure}"
                        },
                    ),
                    "reload_failed",
                )
            slot.swap(fresh, target)
            publish_model()
            metrics.reloads.labels("ok").inc()
        return finish("reload", started, _json(200, {"model": slot.describe()}))

    @app.get("/healthz")
    async def healthz() -> Response:
        started = time.perf_counter()
        return finish(
            "healthz",
            started,
            _json(
                200, {"status": "ok", "queue_depth": batcher.queued_items, "model": slot.describe()}
            ),
        )

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


def uvicorn_server(app, config: ServerConfig, log_level: str = "info"):
    """A `uvicorn.Server` for `app`; `.run()` blocks and handles SIGINT/SIGTERM gracefully
    (stop accepting, finish in-flight requests within graceful_timeout_s, drain the queue)."""
    import uvicorn

    return uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=config.graceful_timeout_s,
            lifespan="on",
        )
    )
