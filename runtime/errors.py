"""Domain errors with stable snake_case codes; the server maps codes onto statuses and frames."""

from __future__ import annotations

import math
from typing import Any


class ThreadlineError(Exception):
    """Base error. `code` is the wire error code; HTTP statuses are the server's business."""

    code = "error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class NotFound(ThreadlineError):
    """Unknown id, or a resource outside the caller's scopes (indistinguishable by design)."""

    code = "not_found"


class InvalidInput(ThreadlineError):
    code = "invalid_input"


class InvalidPayload(ThreadlineError):
    """A resume payload that does not match the action's schema; carries field `errors`."""

    code = "invalid_payload"


class TooLarge(ThreadlineError):
    code = "too_large"


class Forbidden(ThreadlineError):
    code = "forbidden"


class RequesterExcluded(Forbidden):
    """Four-eyes: the requester of an approval may not decide it."""

    code = "requester_excluded"


class NotADecider(Forbidden):
    """The approval policy names other roles, subjects or groups as its deciders."""

    code = "not_a_decider"


class DelegationNotAllowed(Forbidden):
    """The approval policy does not let its deciders hand the action to someone else."""

    code = "delegation_not_allowed"


class Conflict(ThreadlineError):
    code = "conflict"


class AlreadyDecided(Conflict):
    """A decider's second decision on one approval: each counts once."""

    code = "already_decided"


class ActionConflict(Conflict):
    """The pending action was already resolved; `resolved_by` names the winner."""


class VersionMismatch(Conflict):
    pass


class RunActive(Conflict):
    """Input refused with policy `reject`, or a rewrite attempted while a run is active."""

    code = "run_active"


class RunStopping(Conflict):
    """A resume of an action whose run has a stop request: the stop will cancel the action."""

    code = "run_stopping"


class IllegalTransition(ThreadlineError):
    """An out-of-order state change of a run or tool part."""

    code = "illegal_transition"


class InvariantViolation(ThreadlineError):
    """A write that would break a storage invariant (e.g. the tail-message invariant)."""

    code = "invariant_violation"


class LeaseLost(ThreadlineError):
    """A fenced write whose lease expired or was taken over; nothing was written."""

    code = "lease_lost"


class Unavailable(ThreadlineError):
    """A backing service stayed unreachable after retries."""

    code = "unavailable"


class QuotaExceeded(ThreadlineError):
    """A request over one of the deployment's limits; nothing changed.

    Each limit is a subclass with its own code (docs/protocol.md, "Limits"); `retry_after` is
    how many whole seconds the caller should wait before trying again (HTTP `Retry-After`).
    """

    def __init__(self, message: str, *, retry_after: float, **details: Any) -> None:
        self.retry_after = max(1, math.ceil(retry_after))
        super().__init__(message, retry_after=self.retry_after, **details)


class TokenRateLimited(QuotaExceeded):
    code = "token_rate_limited"


class ScopeRateLimited(QuotaExceeded):
    code = "scope_rate_limited"


class QueueFull(QuotaExceeded):
    code = "queue_full"


class ScopeRunsExceeded(QuotaExceeded):
    code = "scope_runs_exceeded"


class TooManyConnections(QuotaExceeded):
    code = "too_many_connections"
