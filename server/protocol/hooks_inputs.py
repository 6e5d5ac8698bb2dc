"""Input models of the schedule and webhook commands (docs/protocol.md, "Schedules", "Webhooks")."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from runtime.domain import MAX_TITLE_CHARS, InputPolicy
from runtime.storage.hooks_store import DeliveryState, MissedFire, WebhookEvent
from runtime.storage.schedule_rules import MAX_TEXT
from server.protocol.inputs import ID_MAX, Input

Id = Annotated[str, Field(min_length=1, max_length=ID_MAX)]
Limit = Annotated[int, Field(ge=1, le=500)]


class CreateSchedule(Input):
    scope: Annotated[str, Field(min_length=1, max_length=ID_MAX)] | None = None
    thread_id: Id | None = None
    new_thread: bool = False
    title: Annotated[str, Field(max_length=MAX_TITLE_CHARS)] = ""
    cron: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    timezone: Annotated[str, Field(min_length=1, max_length=64)] = "UTC"
    run_at: Annotated[float, Field(gt=0, lt=2**40)] | None = None
    text: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    policy: InputPolicy = InputPolicy.ENQUEUE
    missed: MissedFire = MissedFire.RUN_ONCE
    misfire_grace: Annotated[float, Field(ge=0, le=86400)] = 60.0


class ScheduleRef(Input):
    schedule_id: Id


# The previous page's `next_cursor` (opaque, as the thread list's).
Cursor = Annotated[str, Field(min_length=1, max_length=4 * ID_MAX)]


class ScheduleFires(Input):
    schedule_id: Id
    limit: Limit = 100
    cursor: Cursor | None = None


class ListHooks(Input):
    limit: Limit = 100
    cursor: Cursor | None = None


class CreateWebhook(Input):
    scope: Annotated[str, Field(min_length=1, max_length=ID_MAX)] | None = None
    url: Annotated[str, Field(min_length=1, max_length=2000)]
    events: Annotated[list[WebhookEvent], Field(min_length=1, max_length=20)] | None = None
    # A Standard Webhooks secret (`whsec_` + base64); None: one is generated and answered once.
    secret: Annotated[str, Field(pattern=r"^whsec_[A-Za-z0-9+/=]{16,200}$")] | None = None
    enabled: bool = True


class WebhookRef(Input):
    webhook_id: Id


class UpdateWebhook(Input):
    webhook_id: Id
    enabled: bool | None = None
    url: Annotated[str, Field(min_length=1, max_length=2000)] | None = None
    events: Annotated[list[WebhookEvent], Field(min_length=1, max_length=20)] | None = None


class ListDeliveries(Input):
    webhook_id: Id
    state: DeliveryState | None = None
    limit: Limit = 100
    cursor: Cursor | None = None


class DeliveryRef(Input):
    delivery_id: Id


__all__ = [
    "CreateSchedule",
    "CreateWebhook",
    "DeliveryRef",
    "ListDeliveries",
    "ListHooks",
    "ScheduleFires",
    "ScheduleRef",
    "UpdateWebhook",
    "WebhookRef",
]
