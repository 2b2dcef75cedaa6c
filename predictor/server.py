"""`lpc serve`: the batched prediction RPC beside inference (FastAPI + uvicorn).

Endpoints: `POST /v1/predict`, `POST /v1/reload`, `GET /healthz`, `GET /metrics`. See
docs/predictor.md for the JSON, the status codes and the metric names. The app is assembled
here from parts with one job each: settings (server_config.py), the model in service
(server_model.py), endpoints as routers (server_routes.py), reading a bounded JSON body
(server_body.py), refusals as exception classes with one handler (server_errors.py), and
request metrics as middleware (server_middleware.py).

Why it is shaped this way: docs/design.md, "The prediction server".
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from predictor.batching import BatchRecord, MicroBatcher
from predictor.predictor import Predictor
from predictor.rpc_schema import access_request_model, request_model
from predictor.server_config import DEFAULT_PORT, ServerConfig
from predictor.server_errors import RpcError, rpc_error_handler
from predictor.server_metrics import ServerMetrics
from predictor.server_middleware import RequestMetricsMiddleware
from predictor.server_model import (
    ModelSlot,
    ServedModel,
    batch_predict,
    load_for_reload,
    load_served_model,
)
from predictor.server_routes import ServerState, ops_router, rpc_router

__all__ = [
    "DEFAULT_PORT",
    "ModelSlot",
    "ServerConfig",
    "batch_predict",
    "create_app",
    "load_for_reload",
    "load_served_model",
    "uvicorn_server",
]


def create_app(
    config: ServerConfig,
    predictor: ServedModel,
    artifact_path: Path | None = None,
    reload_loader: Callable[[Path, ServedModel], ServedModel] = load_for_reload,
) -> FastAPI:
    """The FastAPI app serving `predictor`, a text `Predictor` or an access-only
    `AccessPredictor` (`artifact_path` is what a bare reload reloads).

    Raises `UnservableFeaturesError` (a ValueError) for a text model whose finish features a
    prediction request cannot carry."""
    if isinstance(predictor, Predictor):
        predictor.check_servable()
    metrics = ServerMetrics()
    slot = ModelSlot(predictor, artifact_path)

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
        max_expected_wait_s=config.admission_wait_s,
    )
    metrics.expected_wait.set_function(lambda: batcher.expected_wait_s() or 0.0)
    state = ServerState(
        config=config,
        slot=slot,
        batcher=batcher,
        metrics=metrics,
        predict_request=request_model(config.limits),
        access_request=access_request_model(config.limits),
        artifact_path=artifact_path,
        model_root=config.model_root or (artifact_path.parent if artifact_path else None),
        reload_loader=reload_loader,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        state.publish_model()
        try:
            yield
        finally:
            # uvicorn calls this after in-flight requests finished (or the grace period ended).
            await batcher.stop()

    app = FastAPI(
        title="LPC predictor", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.server = state
    app.state.metrics = metrics
    app.state.slot = slot
    app.state.batcher = batcher
    app.include_router(rpc_router)
    app.include_router(ops_router)
    app.add_exception_handler(RpcError, rpc_error_handler)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
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
