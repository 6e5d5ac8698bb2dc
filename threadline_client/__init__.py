"""Threadline's Python client for backend actors and scripts (async, typed, with a sync wrapper)."""

from threadline_client.client import ThreadlineClient, payload_dict
from threadline_client.convergence import ThreadState
from threadline_client.exceptions import (
    ActionConflict,
    Conflict,
    Forbidden,
    InvalidInput,
    InvalidPayload,
    NotFound,
    RateLimited,
    RunActive,
    ServerError,
    ThreadlineError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from threadline_client.hooks import Delivery, DeliveryAttempt, Schedule, ScheduleFire, Webhook
from threadline_client.models import (
    Admission,
    Message,
    PendingAction,
    Principal,
    Run,
    Snapshot,
    ThreadInfo,
    VersionAnswer,
)
from threadline_client.sync import SyncThreadlineClient
from threadline_client.watch import ActionsWatch, Backoff, ThreadWatch, WatchEvent

__all__ = [
    "ActionConflict",
    "ActionsWatch",
    "Admission",
    "Backoff",
    "Conflict",
    "Delivery",
    "DeliveryAttempt",
    "Forbidden",
    "InvalidInput",
    "InvalidPayload",
    "Message",
    "NotFound",
    "PendingAction",
    "Principal",
    "RateLimited",
    "Run",
    "RunActive",
    "Schedule",
    "ScheduleFire",
    "ServerError",
    "Snapshot",
    "SyncThreadlineClient",
    "ThreadInfo",
    "ThreadState",
    "ThreadWatch",
    "ThreadlineClient",
    "ThreadlineError",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "VersionAnswer",
    "WatchEvent",
    "Webhook",
    "payload_dict",
]
