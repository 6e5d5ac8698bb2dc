"""Every failure as a wire error: one mapping to code, message, details and HTTP status."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from realtime.bus_errors import BusError
from runtime.errors import Forbidden, QuotaExceeded, ThreadlineError
from runtime.service.thread_service import validation_field_errors
from server.auth import Unauthorized
from server.auth_errors import CODES as AUTH_CODES
from server.protocol.responses import JSONResponse, error_body
from threadline_wire.frames import ErrorFrame

log = logging.getLogger(__name__)


class InvalidJSON(ThreadlineError):
    """A request body or websocket frame that is not JSON."""

    code = "invalid_json"


# The HTTP status of each error code (docs/protocol.md, "Errors"); codes not listed are 400.
# Websocket-only codes (invalid_frame, unknown_type, too_many_subscriptions) never reach HTTP.
STATUS: dict[str, int] = {
    "bad_request": 400,
    "invalid_json": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "forbidden_by_policy": 403,
    "requester_excluded": 403,
    "not_a_decider": 403,
    "delegation_not_allowed": 403,
    "already_decided": 409,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "run_active": 409,
    "run_stopping": 409,
    "illegal_transition": 409,
    "invariant_violation": 409,
    "lease_lost": 409,
    "too_large": 413,
    "invalid_input": 422,
    "invalid_payload": 422,
    # Quotas (docs/protocol.md, "Limits"): each limit its own code, all with Retry-After.
    "token_rate_limited": 429,
    "scope_rate_limited": 429,
    "queue_full": 429,
    "scope_runs_exceeded": 429,
    "too_many_connections": 429,
    "internal_error": 500,
    "unavailable": 503,
    # Why a token was refused (server.auth_errors): each its own code, all 401.
    **dict.fromkeys(AUTH_CODES, 401),
}

# HTTP statuses Starlette raises itself (routing, body limit), as stable error codes.
_HTTP_CODES: dict[int, tuple[str, str]] = {
    400: ("bad_request", "the request is malformed"),
    404: ("not_found", "no such route"),
    405: ("method_not_allowed", "method not allowed on this route"),
    413: ("too_large", "the request body is too large"),
}


@dataclass(frozen=True)
class WireError:
    """An error as both transports say it: the error body's fields and the HTTP status."""

    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    status: int = 400
    headers: dict[str, str] | None = None

    def response(self) -> JSONResponse:
        body = error_body(self.code, self.message, **self.details)
        return JSONResponse(body, status_code=self.status, headers=self.headers)

    def frame(self, frame_id: Any) -> bytes:
        frame = ErrorFrame(code=self.code, message=self.message, id=frame_id, **self.details)
        # Details are JSON-ready values; orjson handles enums, dumps the rest by str().
        return orjson.dumps(
            frame.model_dump(exclude_none=True), default=str, option=orjson.OPT_NON_STR_KEYS
        )


def wire_error(exc: BaseException, *, invalid: str = "the request body is invalid") -> WireError:
    """The wire error for any exception a command raised; `invalid` names what failed validation."""
    if isinstance(exc, ThreadlineError):
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        if isinstance(exc, QuotaExceeded):
            headers = {"Retry-After": str(exc.retry_after)}
        # A code an authorization hook chose is a refusal like `forbidden_by_policy`.
        status = STATUS.get(exc.code, 403 if isinstance(exc, Forbidden) else 400)
        return WireError(exc.code, exc.message, dict(exc.details), status, headers)
    if isinstance(exc, ValidationError):
        errors = validation_field_errors(exc)
        return WireError("invalid_input", invalid, {"errors": errors}, STATUS["invalid_input"])
    if isinstance(exc, HTTPException):
        code, message = _HTTP_CODES.get(exc.status_code, ("http_error", str(exc.detail)))
        return WireError(code, message, {}, exc.status_code, dict(exc.headers or {}))
    if isinstance(exc, ClientDisconnect):  # nobody to answer: said for the log and metrics
        message = "the client went away before its request was complete"
        return WireError("bad_request", message, {}, STATUS["bad_request"])
    if isinstance(exc, BusError):
        message = f"live delivery is unavailable: {exc}"
        return WireError("unavailable", message, {}, STATUS["unavailable"])
    log.error("unexpected error", exc_info=exc)
    return WireError("internal_error", "an unexpected error occurred", {}, 500)


async def handle_error(request: Request, exc: Exception) -> Response:
    """The app's exception handler: what escaped a route, rendered like every other error."""
    return wire_error(exc).response()
