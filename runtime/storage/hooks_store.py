"""The store interface of timers, schedules and webhooks (issue 30), apart from `Store`."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from runtime.domain import InputPolicy
from runtime.storage.retention import RetentionPolicy
from runtime.storage.store import AdmissionLimits
from runtime.storage.thread_query import keyset_cursor


class MissedFire(StrEnum):
    """What a fire later than its schedule's `misfire_grace` does (all workers were down)."""

    RUN_ONCE = "run_once"  # every missed fire collapses into one run, on recovery
    SKIP = "skip"  # missed fires are recorded as skipped; the next fire is the next on time


class ScheduleStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    DONE = "done"  # a one-off schedule that fired


class WebhookEvent(StrEnum):
    RUN_STARTED = "run.started"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    ACTION_CREATED = "action.created"
    ACTION_RESOLVED = "action.resolved"
    # Approval policies: each decider's decision, a deadline's escalation and its expiry.
    ACTION_DECIDED = "action.decided"
    ACTION_ESCALATED = "action.escalated"
    ACTION_EXPIRED = "action.expired"
    MESSAGE_COMMITTED = "message.committed"  # opt-in: never in the default set


# Opt-in: every message, and every decision (one per decider, partial ones too; the settling
# one is also `action.resolved`).
_OPT_IN = (WebhookEvent.MESSAGE_COMMITTED, WebhookEvent.ACTION_DECIDED)
DEFAULT_EVENTS: tuple[WebhookEvent, ...] = tuple(
    event for event in WebhookEvent if event not in _OPT_IN
)


class DeliveryState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"  # failed until its age ran out; `redeliver` makes it pending again


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ScheduleSpec(_Frozen):
    """What a caller asks for; checked by `schedule_rules.check_spec` before any write."""

    scope: str
    thread_id: str | None = None
    new_thread: bool = False
    title: str = ""
    cron: str | None = None
    timezone: str = "UTC"
    run_at: float | None = None
    text: str
    policy: InputPolicy = InputPolicy.ENQUEUE
    missed: MissedFire = MissedFire.RUN_ONCE
    misfire_grace: float = 60.0


class Schedule(ScheduleSpec):
    id: str
    status: ScheduleStatus
    created_by: str
    next_fire_at: float | None
    last_fire_at: float | None
    created_at: float
    updated_at: float


class ScheduleFire(_Frozen):
    """One fire time of a schedule and what it did (`outcome`: admitted, queued, skipped,
    refused)."""

    schedule_id: str
    fire_at: float
    fired_at: float
    outcome: str
    thread_id: str | None = None
    run_id: str | None = None
    queued_item_id: str | None = None
    detail: str | None = None


class DueTimer(_Frozen):
    """A timer claimed by one worker: firing it needs its fencing `token` to still hold."""

    id: str
    kind: str
    ref: str
    due_at: float
    token: int


class FireResult(_Frozen):
    """What firing a timer committed: the thread to invalidate and the run to wake, if any."""

    timer_id: str
    fired: bool
    thread_id: str | None = None
    version: int | None = None
    run_id: str | None = None
    stop_run_id: str | None = None


class WebhookSubscription(_Frozen):
    id: str
    scope: str
    url: str
    events: tuple[WebhookEvent, ...]
    enabled: bool
    created_by: str
    created_at: float
    updated_at: float


class Delivery(_Frozen):
    """One event for one subscription; `id` is its stable `webhook-id`."""

    id: str
    subscription_id: str
    scope: str
    event_type: str
    thread_id: str | None
    run_id: str | None
    action_id: str | None
    message_id: str | None
    detail: str | None
    occurred_at: float
    state: DeliveryState
    attempts: int
    next_attempt_at: float
    last_status: int | None
    last_error: str | None
    delivered_at: float | None
    retry_from: float | None = None

    def payload(self) -> dict[str, Any]:
        """The body posted: built from the committed row alone, so every attempt sends the
        same bytes."""
        data = {
            "scope": self.scope,
            "thread_id": self.thread_id,
            "run_id": self.run_id,
            "action_id": self.action_id,
            "message_id": self.message_id,
        }
        if self.event_type.startswith("run."):
            data["error"] = self.detail
        elif self.event_type == WebhookEvent.MESSAGE_COMMITTED:
            data["role"] = self.detail
        elif self.event_type == WebhookEvent.ACTION_RESOLVED:
            data["resolved_by"] = self.detail
        elif self.event_type == WebhookEvent.ACTION_DECIDED:
            data["decision"] = self.detail  # "<subject>: approved (1 of 2)"
        elif self.event_type in (WebhookEvent.ACTION_ESCALATED, WebhookEvent.ACTION_EXPIRED):
            data["reason"] = self.detail
        return {"type": self.event_type, "timestamp": self.occurred_at, "data": data}


class ClaimedDelivery(_Frozen):
    delivery: Delivery
    url: str
    secret: str
    token: int


class DeliveryAttempt(_Frozen):
    delivery_id: str
    attempt: int
    started_at: float
    status_code: int | None
    latency_ms: float | None
    error: str | None
    owner: str


class AttemptOutcome(_Frozen):
    """What one attempt of a claimed delivery saw, and what happens next (`retry_in` None and
    not `delivered`: dead-lettered)."""

    status_code: int | None
    latency_ms: float
    error: str | None
    delivered: bool
    retry_in: float | None


def fire_cursor(fire: ScheduleFire) -> str:
    """The cursor after `fire` in a schedule's fires (newest first)."""
    return keyset_cursor(fire.fire_at, fire.schedule_id)


def created_cursor(item: Schedule | WebhookSubscription) -> str:
    """The cursor after `item` in its list (schedules, webhook subscriptions: oldest first)."""
    return keyset_cursor(item.created_at, item.id)


def delivery_cursor(delivery: Delivery) -> str:
    """The cursor after `delivery` in a subscription's deliveries (oldest first, then id)."""
    return keyset_cursor(delivery.occurred_at, delivery.id)


class HooksStore(Protocol):
    """Timers, schedules and webhook subscriptions and deliveries; every write one
    transaction, every read filtered by the caller's scopes."""

    # timers
    async def claim_timers(self, owner: str, ttl: float, limit: int) -> list[DueTimer]: ...
    async def fire_timer(self, timer: DueTimer, limits: AdmissionLimits | None) -> FireResult: ...

    # thread retention (docs/operations.md, "Thread retention")
    async def set_retention(self, policy: RetentionPolicy | None) -> None:
        """The deployment's retention timer for `policy` (None: no retention)."""
        ...

    async def expire_threads(self, updated_before: float, limit: int) -> list[str]:
        """Delete up to `limit` idle threads not updated since `updated_before` (database
        clock), in one transaction; their ids. A queued, running or waiting run (so queued
        input and a pending action), an active schedule or a held lease keeps a thread."""
        ...

    # schedules
    async def create_schedule(self, spec: ScheduleSpec, created_by: str) -> Schedule: ...
    async def list_schedules(
        self, scopes: Collection[str], limit: int = 100, after: str | None = None
    ) -> list[Schedule]:
        """Oldest first, then by id; `after` (a `created_cursor`) pages on."""
        ...

    async def get_schedule(self, scopes: Collection[str], schedule_id: str) -> Schedule: ...
    async def set_schedule_paused(
        self, scopes: Collection[str], schedule_id: str, paused: bool
    ) -> Schedule: ...
    async def delete_schedule(self, scopes: Collection[str], schedule_id: str) -> None: ...
    async def schedule_fires(
        self, scopes: Collection[str], schedule_id: str, limit: int = 100, after: str | None = None
    ) -> list[ScheduleFire]: ...

    # webhooks
    async def create_subscription(
        self,
        scope: str,
        url: str,
        events: Sequence[WebhookEvent],
        secret: str,
        created_by: str,
        enabled: bool = True,
    ) -> WebhookSubscription: ...
    async def list_subscriptions(
        self, scopes: Collection[str], limit: int = 100, after: str | None = None
    ) -> list[WebhookSubscription]:
        """Oldest first, then by id; `after` (a `created_cursor`) pages on."""
        ...

    async def update_subscription(
        self,
        scopes: Collection[str],
        subscription_id: str,
        *,
        enabled: bool | None = None,
        url: str | None = None,
        events: Sequence[WebhookEvent] | None = None,
    ) -> WebhookSubscription: ...
    async def delete_subscription(self, scopes: Collection[str], subscription_id: str) -> None: ...
    async def list_deliveries(
        self,
        scopes: Collection[str],
        subscription_id: str,
        *,
        state: DeliveryState | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[Delivery]: ...
    async def delivery_attempts(
        self, scopes: Collection[str], delivery_id: str
    ) -> list[DeliveryAttempt]: ...
    async def redeliver(self, scopes: Collection[str], delivery_id: str) -> Delivery: ...
    async def claim_deliveries(
        self, owner: str, ttl: float, limit: int
    ) -> list[ClaimedDelivery]: ...
    async def record_attempt(
        self, claimed: ClaimedDelivery, owner: str, outcome: AttemptOutcome
    ) -> bool: ...


__all__ = [
    "DEFAULT_EVENTS",
    "AttemptOutcome",
    "ClaimedDelivery",
    "Delivery",
    "DeliveryAttempt",
    "DeliveryState",
    "DueTimer",
    "FireResult",
    "HooksStore",
    "MissedFire",
    "Schedule",
    "ScheduleFire",
    "ScheduleSpec",
    "ScheduleStatus",
    "WebhookEvent",
    "WebhookSubscription",
]
