"""The prediction RPC's refusals as exception classes, turned into responses in one place.

Every non-200 answer the server gives on purpose is one of these: raised wherever the
problem is found (the auth dependency, the body reader, an endpoint), each class carries its
status code, its `errors_total{kind}` label and any headers, and `rpc_error_handler` (the
app's single exception handler for them) counts the kind and writes the JSON body. So a
status code, a body shape or a metric label is decided by the class alone.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from fastapi import Request, Response


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    """JSON without NaN or infinities (a probability is always finite)."""
    return Response(
        json.dumps(payload, allow_nan=False),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


class RpcError(Exception):
    """A refusal: `{"detail": detail}` with this class's status code, counted by kind."""

    status_code: ClassVar[int] = 500
    kind: ClassVar[str] = "internal"

    def __init__(self, detail: Any) -> None:
        super().__init__(detail if isinstance(detail, str) else self.kind)
        self.detail = detail

    def payload(self) -> dict[str, Any]:
        return {"detail": self.detail}

    def headers(self) -> dict[str, str] | None:
        return None


class Unauthorized(RpcError):
    status_code = 401
    kind = "unauthorized"

    def __init__(self) -> None:
        super().__init__("missing or wrong bearer token")

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class Forbidden(RpcError):
    status_code = 403
    kind = "forbidden"


class ReloadFailed(RpcError):
    status_code = 409
    kind = "reload_failed"


class BodyTooLarge(RpcError):
    status_code = 413
    kind = "body_too_large"


class InvalidRequest(RpcError):
    """422: `detail` is a string or a list of `{"loc", "msg", "type", ...}` entries."""

    status_code = 422
    kind = "invalid"


def invalid_body(msg: str, error_type: str) -> InvalidRequest:
    """422 for a body that is not acceptable JSON at all (the whole body is the location)."""
    return InvalidRequest([{"loc": ["body"], "msg": msg, "type": error_type}])


class PredictionFailed(RpcError):
    status_code = 500
    kind = "prediction_failed"


class Overloaded(RpcError):
    """503 at once: the caller falls back to its default probability and may retry."""

    status_code = 503
    kind = "overloaded"

    def __init__(self, reason: str) -> None:
        super().__init__("overloaded")
        self.reason = reason

    def payload(self) -> dict[str, Any]:
        return {"detail": "overloaded", "reason": self.reason}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class ShuttingDown(RpcError):
    status_code = 503
    kind = "shutting_down"

    def __init__(self) -> None:
        super().__init__("shutting down")


class PredictTimeout(RpcError):
    status_code = 504
    kind = "timeout"


async def rpc_error_handler(request: Request, error: Exception) -> Response:
    """The app's one handler for `RpcError`: count the kind, answer with the class's status."""
    assert isinstance(error, RpcError)
    request.app.state.metrics.errors.labels(error.kind).inc()
    return json_response(error.status_code, error.payload(), error.headers())
