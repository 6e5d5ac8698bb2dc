"""Domain errors with stable snake_case codes, mapped by the server onto statuses and frames."""

from __future__ import annotations

from typing import Any


class ThreadlineError(Exception):
    """Base error. `code` is the wire error code, `status` the HTTP status it maps to."""

    code = "error"
    status = 400

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_wire(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.details}}


class NotFound(ThreadlineError):
    """Unknown id, or a resource outside the caller's scopes (indistinguishable by design)."""

    code = "not_found"
    status = 404


class InvalidInput(ThreadlineError):
    code = "invalid_input"
    status = 422


class InvalidPayload(ThreadlineError):
    """A resume payload that does not match the action's schema; carries field `errors`."""

    code = "invalid_payload"
    status = 422


class TooLarge(ThreadlineError):
    code = "too_large"
    status = 413


class Forbidden(ThreadlineError):
    code = "forbidden"
    status = 403


class Conflict(ThreadlineError):
    code = "conflict"
    status = 409


class ActionConflict(Conflict):
    """The pending action was already resolved; `resolved_by` names the winner."""


class VersionMismatch(Conflict):
    pass


class RunActive(Conflict):
    """Input refused with policy `reject`, or a rewrite attempted while a run is active."""

    code = "run_active"


class IllegalTransition(ThreadlineError):
    """An out-of-order state change of a run or tool part."""

    code = "illegal_transition"
    status = 409


class InvariantViolation(ThreadlineError):
    """A write that would break a storage invariant (e.g. the tail-message invariant)."""

    code = "invariant_violation"
    status = 409


class LeaseLost(ThreadlineError):
    """A fenced write whose lease expired or was taken over; nothing was written."""

    code = "lease_lost"
    status = 409


class Unavailable(ThreadlineError):
    """A backing service stayed unreachable after retries."""

    code = "unavailable"
    status = 503
