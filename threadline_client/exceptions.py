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


_BY_CODE: dict[str, type[ThreadlineError]] = {
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "run_active": RunActive,
    "invalid_input": InvalidInput,
    "invalid_payload": InvalidPayload,
    "too_large": TooLarge,
    "rate_limited": RateLimited,
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
