"""Typed errors of the Threadline client, one per wire error code a caller acts on."""

from __future__ import annotations

from typing import Any

import httpx


class ThreadlineError(Exception):
    """An error answer of the server: `code`, `message`, the HTTP `status` and its details."""

    def __init__(
        self, code: str, message: str, status: int = 0, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.details = dict(details or {})


class Unauthorized(ThreadlineError):
    """The token is missing, malformed or unknown (401; websocket close 4401)."""


class Forbidden(ThreadlineError):
    """The token's role may not do this (403)."""


class NotFound(ThreadlineError):
    """No such thread or action, or one outside the token's scopes (404)."""


class Conflict(ThreadlineError):
    """409: a state that changed under the caller (`expected_version`, run active, ...)."""

    @property
    def current_version(self) -> int | None:
        value = self.details.get("current_version")
        return int(value) if isinstance(value, int) else None


class ActionConflict(Conflict):
    """The action was already resolved: `resolved_by` names the winner's subject."""

    @property
    def resolved_by(self) -> str | None:
        value = self.details.get("resolved_by")
        return str(value) if value is not None else None

    @property
    def state(self) -> str | None:
        value = self.details.get("state")
        return str(value) if value is not None else None


class RunActive(Conflict):
    """Policy `reject` (or a history rewrite) while a run is active."""


class RunStopping(Conflict):
    """A resume or result for an action whose run has a stop request: the stop cancels it."""


class IllegalTransition(Conflict):
    """An out-of-order state change of a run or tool part."""


class InvariantViolation(Conflict):
    """A write that would break a storage invariant; nothing changed."""


class LeaseLost(Conflict):
    """Internal to the server (a fenced write lost its lease); not expected at the API."""


class BadRequest(ThreadlineError):
    """The request (or websocket frame) could not be read: `bad_request`, `invalid_json`."""


class MethodNotAllowed(ThreadlineError):
    """The route exists, the method does not (405)."""


class InvalidInput(ThreadlineError):
    """The request does not match the route's schema (422 invalid_input)."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        return list(self.details.get("errors") or [])


class InvalidPayload(InvalidInput):
    """A resume payload that does not match the action's JSON Schema; nothing changed."""


class TooLarge(ThreadlineError):
    """Body, text, title or metadata over the server's limit (413)."""


class RateLimited(ThreadlineError):
    """Too many requests (429): retry after `retry_after` seconds."""

    @property
    def retry_after(self) -> float | None:
        value = self.details.get("retry_after")
        try:
            return float(value) if value is not None else None
        except (TypeError, ValueError):
            return None


class Unavailable(ThreadlineError):
    """The server's storage or bus is unreachable for now (503); retry later."""


class ServerError(ThreadlineError):
    """An unexpected server failure (5xx)."""


class ConnectionFailed(Unavailable):
    """The server could not be reached (refused, reset, timed out): no answer at all, so
    `code` is `connection_failed` and `status` 0; the transport's error is `__cause__`."""


# Every 401 code a JWT refusal names is an Unauthorized: the caller's answer is a new token.
_UNAUTHORIZED_CODES = (
    "unauthorized",
    "invalid_token",
    "invalid_issuer",
    "invalid_audience",
    "token_expired",
    "token_not_yet_valid",
    "invalid_signature",
    "unsupported_algorithm",
    "token_mismatch",
)
_RATE_CODES = (
    "token_rate_limited",
    "scope_rate_limited",
    "queue_full",
    "scope_runs_exceeded",
    "too_many_connections",
)


# Every error code of docs/protocol.md (tests/unit/test_client_errors.py compares the lists).
_BY_CODE: dict[str, type[ThreadlineError]] = {
    **dict.fromkeys(_UNAUTHORIZED_CODES, Unauthorized),
    **dict.fromkeys(_RATE_CODES, RateLimited),
    "forbidden": Forbidden,
    # An approval policy's refusals (docs/protocol.md, "Approval policies").
    "requester_excluded": Forbidden,
    "not_a_decider": Forbidden,
    "delegation_not_allowed": Forbidden,
    # The deployment's authorization hook (docs/authorization.md); its own codes are 403 too.
    "forbidden_by_policy": Forbidden,
    "already_decided": Conflict,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "bad_request": BadRequest,
    "invalid_json": BadRequest,
    "conflict": Conflict,
    "run_active": RunActive,
    "run_stopping": RunStopping,
    "illegal_transition": IllegalTransition,
    "invariant_violation": InvariantViolation,
    "lease_lost": LeaseLost,
    "invalid_input": InvalidInput,
    "invalid_payload": InvalidPayload,
    "too_large": TooLarge,
    "unavailable": Unavailable,
    "internal_error": ServerError,
}


def error_from(code: str, message: str, status: int, details: dict[str, Any]) -> ThreadlineError:
    """The typed error of one error body (or websocket error frame)."""
    if code == "conflict":
        kind: type[ThreadlineError] = ActionConflict if "resolved_by" in details else Conflict
    else:
        # Every 401 is an Unauthorized, whatever its code says (a JWT's refusal names why).
        kind = _BY_CODE.get(code) or (
            Unauthorized
            if status == 401
            else Forbidden
            if status == 403
            else RateLimited
            if status == 429
            else ServerError
            if status >= 500
            else ThreadlineError
        )
    return kind(code, message, status, details)


def error_of_response(response: httpx.Response) -> ThreadlineError:
    """The typed error of a non-2xx HTTP answer (any body shape, even a proxy's HTML page)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        error = {"code": f"http_{response.status_code}", "message": response.text[:200]}
    details = {k: v for k, v in error.items() if k not in ("code", "message")}
    retry_after = response.headers.get("Retry-After")
    if retry_after is not None and "retry_after" not in details:
        details["retry_after"] = retry_after
    return error_from(
        str(error.get("code", "http_error")),
        str(error.get("message", "")),
        response.status_code,
        details,
    )
