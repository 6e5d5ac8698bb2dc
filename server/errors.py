"""Maps domain errors, validation errors and unexpected failures onto JSON error responses."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from runtime.errors import ThreadlineError
from server.responses import JSONResponse, error_response

log = logging.getLogger(__name__)


class Unauthorized(ThreadlineError):
    """A missing, malformed or unknown bearer token."""

    code = "unauthorized"
    status = 401


class InvalidJSON(ThreadlineError):
    """A request body or websocket frame that is not JSON."""

    code = "invalid_json"
    status = 400


class InternalError(ThreadlineError):
    code = "internal_error"
    status = 500


# HTTP statuses Starlette raises itself (routing, body limit), as stable error codes.
_HTTP_CODES: dict[int, tuple[str, str]] = {
    400: ("bad_request", "the request is malformed"),
    404: ("not_found", "no such route"),
    405: ("method_not_allowed", "method not allowed on this route"),
    413: ("too_large", "the request body is too large"),
}


def validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Field errors as `[{"loc": [...], "msg": ...}]`, the shape every 422 uses."""
    return [
        {"loc": [str(part) for part in err["loc"]], "msg": err["msg"]} for err in exc.errors()
    ]


def threadline_error_response(exc: ThreadlineError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    return JSONResponse(exc.to_wire(), status_code=exc.status, headers=headers)


def validation_error_response(exc: ValidationError) -> JSONResponse:
    return error_response(
        422, "invalid_input", "the request body is invalid", errors=validation_errors(exc)
    )


def http_exception_response(exc: HTTPException) -> JSONResponse:
    code, message = _HTTP_CODES.get(exc.status_code, ("http_error", str(exc.detail)))
    return error_response(exc.status_code, code, message, headers=dict(exc.headers or {}))


def internal_error_response(exc: BaseException) -> JSONResponse:
    log.error("unexpected error", exc_info=exc)
    return error_response(500, "internal_error", "an unexpected error occurred")


def response_for(exc: Exception) -> Response:
    """The JSON error response for any exception an endpoint raised."""
    if isinstance(exc, ThreadlineError):
        return threadline_error_response(exc)
    if isinstance(exc, ValidationError):
        return validation_error_response(exc)
    if isinstance(exc, HTTPException):
        return http_exception_response(exc)
    return internal_error_response(exc)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return http_exception_response(exc)


async def handle_threadline_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ThreadlineError)
    return threadline_error_response(exc)


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    return internal_error_response(exc)
