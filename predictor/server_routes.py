"""The prediction RPC's endpoints, as routers over one `ServerState`.

`rpc_router` (`/v1/predict`, `/v1/reload`) requires the bearer token through a router
dependency, checked before the body is read; `ops_router` (`/healthz`, `/metrics`) needs none.
Endpoints raise the typed refusals of `server_errors` and return only their 200s: statuses,
bodies and error counts are decided there, request counts in `server_middleware`.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ValidationError

from predictor.access_features import computable_on
from predictor.access_predictor import AccessPredictor
from predictor.artifact import ArtifactError
from predictor.batching import BatcherStoppedError, MicroBatcher, QueueFullError
from predictor.features import ConversationWindow
from predictor.predictor import Predictor
from predictor.rpc_schema import (
    ReloadRequest,
    access_item_details,
    missing_field_details,
    out_of_range_details,
    validation_details,
    wrong_kind_details,
)
from predictor.server_body import read_json_body
from predictor.server_config import ServerConfig
from predictor.server_errors import (
    Forbidden,
    InvalidRequest,
    Overloaded,
    PredictionFailed,
    PredictTimeout,
    ReloadFailed,
    ShuttingDown,
    Unauthorized,
    json_response,
)
from predictor.server_metrics import ServerMetrics
from predictor.server_model import ModelSlot, ServedModel

# Tokenizing more characters than this to estimate a request's cost moves off the event loop
# (a few milliseconds), so one large request does not stall every other caller's admission.
INLINE_ESTIMATE_CHARS = 16_384


@dataclass
class ServerState:
    """Everything the endpoints share, owned by one app (`app.state.server`)."""

    config: ServerConfig
    slot: ModelSlot
    batcher: MicroBatcher
    metrics: ServerMetrics
    predict_request: type[BaseModel]  # rpc_schema.request_model(config.limits)
    access_request: type[BaseModel]  # rpc_schema.access_request_model(config.limits)
    artifact_path: Path | None  # what a bare reload reloads
    model_root: Path | None  # reloads may only load artifacts under this folder
    reload_loader: Callable[[Path, ServedModel], ServedModel]
    reload_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def publish_model(self) -> None:
        info = self.slot.describe()
        self.metrics.set_model(
            info["embedder_id"], info["weights_sha256"], info["artifact"] or "", info["kind"]
        )


async def server_state(request: Request) -> ServerState:
    return request.app.state.server


State = Annotated[ServerState, Depends(server_state)]


async def require_token(request: Request) -> None:
    """Raise `Unauthorized` unless the configured bearer token (if any) was sent; compared
    in constant time."""
    token = request.app.state.server.config.token
    if token is None:
        return
    scheme, _, supplied = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        supplied.strip().encode(), token.encode()
    ):
        raise Unauthorized()


rpc_router = APIRouter(prefix="/v1", dependencies=[Depends(require_token)])
ops_router = APIRouter()


def parse_windows(payload: object, state: ServerState) -> list[ConversationWindow]:
    """The request's windows, or `InvalidRequest` naming each bad field (and each item the
    model in service cannot predict for lack of a field its features read)."""
    wrong_kind = wrong_kind_details(payload, access_model=False)
    if wrong_kind:
        raise InvalidRequest(wrong_kind)
    try:
        parsed = state.predict_request.model_validate(payload)
    except ValidationError as invalid:
        raise InvalidRequest(validation_details(invalid.errors())) from None
    windows = parsed.windows()
    model = state.slot.current
    missing = missing_field_details(windows, model.extra_features) if model.extra_features else []
    if missing:
        raise InvalidRequest(missing)
    return windows


def predict_access(payload: object, model: AccessPredictor, state: ServerState) -> np.ndarray:
    """Probabilities for an access-only model's items, computed here in one batched forward
    pass (microseconds: no queue, no worker thread, and no reload can swap the model
    mid-request); `InvalidRequest` names each bad item, field and feature name, and each
    feature value the model's float32 arithmetic overflows on."""
    wrong_kind = wrong_kind_details(payload, access_model=True)
    if wrong_kind:
        raise InvalidRequest(wrong_kind)
    try:
        parsed = state.access_request.model_validate(payload)
    except ValidationError as invalid:
        raise InvalidRequest(validation_details(invalid.errors())) from None
    names = model.feature_names
    bad_names = access_item_details([item.access_features for item in parsed.items], names)
    if bad_names:
        raise InvalidRequest(bad_names)
    started = time.perf_counter()
    rows = np.array(parsed.feature_rows(names), dtype=np.float64)
    probabilities = model.predict_checked(rows)
    out_of_range = np.flatnonzero(np.isnan(probabilities))
    if out_of_range.size:  # float32 overflowed: no probability to give (rpc_schema.py)
        standardised = model.standardised(rows[out_of_range])
        raise InvalidRequest(
            out_of_range_details(rows[out_of_range], standardised, names, out_of_range)
        )
    state.metrics.batch_latency.observe(time.perf_counter() - started)
    state.metrics.batch_size.observe(len(probabilities))
    state.metrics.predictions.inc(len(probabilities))
    return probabilities


def probabilities_response(probabilities: np.ndarray) -> Response:
    """The 200 of a predict request. Every probability is in [0, 1] by construction (items
    an access model overflows on and windows a text model cannot answer are refused before
    this); should one not be, the model is at fault, not the caller: `PredictionFailed`
    names the items, where JSON, which has no NaN, would fail as a plain-text 500."""
    bad = np.flatnonzero(~((probabilities >= 0.0) & (probabilities <= 1.0)))
    if bad.size:
        raise PredictionFailed(
            f"prediction failed: the model gave no probability in [0, 1] for items "
            f"{bad.tolist()} ({[repr(float(p)) for p in probabilities[bad[:8]]]})"
        )
    return json_response(200, {"probabilities": probabilities.tolist()})


async def window_tokens(windows: list[ConversationWindow], state: ServerState) -> list[int]:
    """Each window's cost in embedder tokens (`predictor.rpc_admission`)."""
    estimator = state.slot.estimator
    if estimator.chars_to_count(windows) <= INLINE_ESTIMATE_CHARS:
        return estimator.window_tokens(windows).tolist()
    return (await asyncio.to_thread(estimator.window_tokens, windows)).tolist()


@rpc_router.post("/predict")
async def predict(request: Request, state: State) -> Response:
    # Under overload every request is refused, whatever it holds: say so before reading,
    # parsing and validating its body, so that refusing stays cheap for the event loop.
    refusal = state.batcher.refusal() if state.batcher.accepting else None
    if refusal is not None:
        raise Overloaded(refusal)
    payload = await read_json_body(request, state.config.limits)
    model = state.slot.current
    if isinstance(model, AccessPredictor):
        return probabilities_response(predict_access(payload, model, state))
    windows = parse_windows(payload, state)
    tokens = await window_tokens(windows, state)
    timeout_s = state.config.request_timeout_s
    try:
        pending = state.batcher.enqueue(windows, tokens)
        probabilities = await asyncio.wait_for(pending, timeout=timeout_s)
    except QueueFullError as full:
        raise Overloaded(str(full)) from None
    except BatcherStoppedError:
        raise ShuttingDown() from None
    except TimeoutError:
        raise PredictTimeout(f"no answer within {timeout_s} s") from None
    except Exception as failure:  # a failed batch: report it, keep serving
        raise PredictionFailed(
            f"prediction failed: {type(failure).__name__}: {failure}"
        ) from failure
    # NaN: a model needing a field these lack was swapped in while they waited (batch_predict)
    swapped = np.flatnonzero(np.isnan(probabilities)).tolist()
    if swapped and (unanswered := missing_field_details(windows, computable_on("window"), swapped)):
        raise InvalidRequest(unanswered)
    if swapped:  # an access-only model was swapped in while these waited (batch_predict)
        raise InvalidRequest(
            [
                {
                    "loc": ["items", i],
                    "msg": "an access-only model was swapped in while this item waited: "
                    "send access_features instead",
                    "type": "wrong_model_kind",
                }
                for i in swapped
            ]
        )
    return probabilities_response(probabilities)


@rpc_router.post("/reload")
async def reload(request: Request, state: State) -> Response:
    payload = await read_json_body(request, state.config.limits)
    try:
        parsed = ReloadRequest.model_validate(payload if payload is not None else {})
    except ValidationError as invalid:
        raise InvalidRequest(validation_details(invalid.errors())) from None
    # A bare reload re-reads the path the server started with: typically the registry's
    # "current" link, repointed by a promotion. Links are followed at load time only.
    target = Path(parsed.artifact) if parsed.artifact else state.artifact_path
    if target is None:
        raise InvalidRequest("no artifact given and the server was not started from one")
    root = state.model_root
    if root is not None and not target.resolve().is_relative_to(root.resolve()):
        raise Forbidden(f"{target} is outside the model root {root}")
    slot = state.slot
    async with state.reload_lock:
        try:
            fresh = await asyncio.to_thread(state.reload_loader, target, slot.current)
            if isinstance(fresh, Predictor):  # an access model reads only what items carry
                fresh.check_servable()
        except (ArtifactError, OSError, ValueError) as failure:
            state.metrics.reloads.labels("failed").inc()
            raise ReloadFailed(
                f"reload failed, still serving generation {slot.generation}: {failure}"
            ) from None
        slot.swap(fresh, target)
        state.publish_model()
        state.metrics.reloads.labels("ok").inc()
    return json_response(200, {"model": slot.describe()})


@ops_router.get("/healthz")
async def healthz(state: State) -> Response:
    return json_response(
        200,
        {"status": "ok", "queue_depth": state.batcher.queued_items, "model": state.slot.describe()},
    )


@ops_router.get("/metrics")
async def metrics(state: State) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
