"""The command-table rows of schedules and webhooks; `commands.COMMANDS` appends them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.domain import Principal
from runtime.errors import InvalidInput
from runtime.hooks.hooks_service import HooksService, hooks_for
from runtime.service.thread_service import require_trusted
from runtime.storage.hooks_store import (
    Delivery,
    DeliveryState,
    Schedule,
    WebhookSubscription,
    created_cursor,
    delivery_cursor,
    fire_cursor,
)
from server.protocol.answers import next_cursor
from server.protocol.command_model import Command, Http
from server.protocol.hooks_inputs import (
    CreateSchedule,
    CreateWebhook,
    DeliveryRef,
    ListDeliveries,
    ListHooks,
    ScheduleFires,
    ScheduleRef,
    UpdateWebhook,
    WebhookRef,
)

READ = "a read: over HTTP only"
S = "/v1/schedules/{schedule_id}"
W = "/v1/webhooks/{webhook_id}"
SCHEDULE = (
    '`{"id", "scope", "thread_id", "new_thread", "cron", "timezone", "run_at", "text", '
    '"policy", "missed", "misfire_grace", "status", "next_fire_at", "last_fire_at", ...}`'
)
WEBHOOK = '`{"id", "scope", "url", "events", "enabled", "created_by", "created_at", ...}`'
ONE_SCHEDULE = f'`{{"schedule": {SCHEDULE.strip("`")}}}`'
DELIVERY = (
    '`{"id" (the webhook-id), "event_type", "state", "attempts", "next_attempt_at", '
    '"last_status", "last_error", "payload"}`'
)


def hooks(caller: Any) -> HooksService:
    return hooks_for(caller.service)


def _int(query: Mapping[str, str], name: str, default: int) -> int:
    raw = query.get(name, str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= 500:
        raise InvalidInput(f"query parameter {name!r} must be an integer from 1 to 500")
    return int(raw)


def limit_query(query: Mapping[str, str]) -> dict[str, Any]:
    return {"limit": _int(query, "limit", 100)}


def paged_query(query: Mapping[str, str]) -> dict[str, Any]:
    """`limit` and the previous page's `cursor`."""
    fields = limit_query(query)
    if "cursor" in query:
        fields["cursor"] = query["cursor"]
    return fields


def deliveries_query(query: Mapping[str, str]) -> dict[str, Any]:
    fields = paged_query(query)
    state = query.get("state")
    if state is not None:
        try:
            fields["state"] = DeliveryState(state)
        except ValueError as exc:
            states = ", ".join(s.value for s in DeliveryState)
            raise InvalidInput(f"query parameter 'state' must be one of {states}") from exc
    return fields


def schedule_answer(schedule: Schedule) -> dict[str, Any]:
    return schedule.model_dump(mode="json")


def webhook_answer(subscription: WebhookSubscription) -> dict[str, Any]:
    return subscription.model_dump(mode="json")


# Single objects are answered under their name: a websocket `ack` carries the frame's own `id`.
def one_schedule(schedule: Schedule) -> dict[str, Any]:
    return {"schedule": schedule_answer(schedule)}


def one_webhook(subscription: WebhookSubscription, secret: str | None = None) -> dict[str, Any]:
    answer = webhook_answer(subscription)
    return {"webhook": answer if secret is None else {**answer, "secret": secret}}


def delivery_answer(delivery: Delivery) -> dict[str, Any]:
    return {**delivery.model_dump(mode="json"), "payload": delivery.payload()}


def trusted(principal: Principal) -> None:
    require_trusted(principal)


HOOKS_COMMANDS: tuple[Command[Any, Any], ...] = (
    Command(
        name="schedule.create",
        input=CreateSchedule,
        # Only the input's own fields: a websocket frame also carries `type` and `id`.
        call=lambda c, i: hooks(c).create_schedule(
            c.principal, **i.model_dump(include=set(CreateSchedule.model_fields))
        ),
        answer=lambda i, s: one_schedule(s),
        answer_doc=ONE_SCHEDULE,
        http=Http("POST", "/v1/schedules", "create_schedule", status=201),
    ),
    Command(
        name="schedule.list",
        input=ListHooks,
        call=lambda c, i: hooks(c).list_schedules(c.principal, i.limit, i.cursor),
        answer=lambda i, items: {
            "schedules": [schedule_answer(s) for s in items],
            "next_cursor": next_cursor(items, i.limit, created_cursor),
        },
        answer_doc=f'`{{"schedules": [{SCHEDULE.strip("`")}], "next_cursor"}}`, oldest first; '
        "`?cursor=` pages on",
        reply=None,
        http=Http("GET", "/v1/schedules", "list_schedules", body=False, query=paged_query),
        note=READ,
        limited=False,
    ),
    Command(
        name="schedule.get",
        input=ScheduleRef,
        call=lambda c, i: hooks(c).get_schedule(c.principal, i.schedule_id),
        answer=lambda i, s: one_schedule(s),
        answer_doc=ONE_SCHEDULE,
        reply=None,
        http=Http("GET", S, "get_schedule", body=False),
        note=READ,
        limited=False,
    ),
    Command(
        name="schedule.fires",
        input=ScheduleFires,
        call=lambda c, i: hooks(c).schedule_fires(c.principal, i.schedule_id, i.limit, i.cursor),
        answer=lambda i, fires: {
            "fires": [f.model_dump(mode="json") for f in fires],
            "next_cursor": next_cursor(fires, i.limit, fire_cursor),
        },
        answer_doc='`{"fires": [{"fire_at", "fired_at", "outcome", "thread_id", "run_id", '
        '"queued_item_id", "detail"}], "next_cursor"}`, newest first; `?cursor=` pages on',
        reply=None,
        http=Http("GET", f"{S}/fires", "schedule_fires", body=False, query=paged_query),
        note=READ,
        limited=False,
    ),
    Command(
        name="schedule.pause",
        input=ScheduleRef,
        call=lambda c, i: hooks(c).pause_schedule(c.principal, i.schedule_id, True),
        answer=lambda i, s: one_schedule(s),
        answer_doc=ONE_SCHEDULE,
        http=Http("POST", f"{S}/pause", "pause_schedule", body=False),
    ),
    Command(
        name="schedule.resume",
        input=ScheduleRef,
        call=lambda c, i: hooks(c).pause_schedule(c.principal, i.schedule_id, False),
        answer=lambda i, s: one_schedule(s),
        answer_doc=f"{ONE_SCHEDULE}; the next fire is the next one after now",
        http=Http("POST", f"{S}/resume", "resume_schedule", body=False),
    ),
    Command(
        name="schedule.delete",
        input=ScheduleRef,
        call=lambda c, i: hooks(c).delete_schedule(c.principal, i.schedule_id),
        answer=lambda i, r: {"schedule_id": i.schedule_id, "deleted": True},
        answer_doc='`{"schedule_id", "deleted": true}`',
        http=Http("DELETE", S, "delete_schedule", body=False),
    ),
    Command(
        name="webhook.create",
        input=CreateWebhook,
        call=lambda c, i: hooks(c).create_webhook(
            c.principal,
            url=i.url,
            events=i.events,
            secret=i.secret,
            enabled=i.enabled,
            scope=i.scope,
        ),
        answer=lambda i, made: one_webhook(*made),
        answer_doc='`{"webhook": {"id", "scope", "url", "events", "enabled", "secret", ...}}`: '
        "the secret is answered this once; refused URLs are "
        "`invalid_input`",
        reply=None,
        http=Http("POST", "/v1/webhooks", "create_webhook", status=201),
        authorize=trusted,
        note="answers the secret: over HTTP only",
    ),
    Command(
        name="webhook.list",
        input=ListHooks,
        call=lambda c, i: hooks(c).list_webhooks(c.principal, i.limit, i.cursor),
        answer=lambda i, items: {
            "webhooks": [webhook_answer(s) for s in items],
            "next_cursor": next_cursor(items, i.limit, created_cursor),
        },
        answer_doc=f'`{{"webhooks": [{WEBHOOK.strip("`")}], "next_cursor"}}` (never the secret), '
        "oldest first; `?cursor=` pages on",
        reply=None,
        http=Http("GET", "/v1/webhooks", "list_webhooks", body=False, query=paged_query),
        authorize=trusted,
        note=READ,
        limited=False,
    ),
    Command(
        name="webhook.update",
        input=UpdateWebhook,
        call=lambda c, i: hooks(c).update_webhook(
            c.principal, i.webhook_id, enabled=i.enabled, url=i.url, events=i.events
        ),
        answer=lambda i, s: one_webhook(s),
        answer_doc=f'`{{"webhook": {WEBHOOK.strip("`")}}}`; changes the fields given '
        "(`enabled`, `url`, `events`)",
        http=Http("POST", W, "update_webhook"),
        authorize=trusted,
    ),
    Command(
        name="webhook.delete",
        input=WebhookRef,
        call=lambda c, i: hooks(c).delete_webhook(c.principal, i.webhook_id),
        answer=lambda i, r: {"webhook_id": i.webhook_id, "deleted": True},
        answer_doc='`{"webhook_id", "deleted": true}`; its deliveries go with it',
        http=Http("DELETE", W, "delete_webhook", body=False),
        authorize=trusted,
    ),
    Command(
        name="webhook.deliveries",
        input=ListDeliveries,
        call=lambda c, i: hooks(c).deliveries(
            c.principal, i.webhook_id, i.state, i.limit, i.cursor
        ),
        answer=lambda i, items: {
            "deliveries": [delivery_answer(d) for d in items],
            "next_cursor": next_cursor(items, i.limit, delivery_cursor),
        },
        answer_doc=f'`{{"deliveries": [{DELIVERY.strip("`")}], "next_cursor"}}`, oldest first; '
        "`?state=pending|delivered|dead`, `?cursor=` pages on",
        reply=None,
        http=Http(
            "GET", f"{W}/deliveries", "webhook_deliveries", body=False, query=deliveries_query
        ),
        authorize=trusted,
        note=READ,
        limited=False,
    ),
    Command(
        name="delivery.attempts",
        input=DeliveryRef,
        call=lambda c, i: hooks(c).attempts(c.principal, i.delivery_id),
        answer=lambda i, items: {"attempts": [a.model_dump(mode="json") for a in items]},
        answer_doc='`{"attempts": [{"attempt", "started_at", "status_code", "latency_ms", '
        '"error", "owner"}]}`: the delivery log',
        reply=None,
        http=Http("GET", "/v1/deliveries/{delivery_id}/attempts", "delivery_attempts", body=False),
        authorize=trusted,
        note=READ,
        limited=False,
    ),
    Command(
        name="delivery.redeliver",
        input=DeliveryRef,
        call=lambda c, i: hooks(c).redeliver(c.principal, i.delivery_id),
        answer=lambda i, d: {"delivery": delivery_answer(d)},
        answer_doc=f'`{{"delivery": {DELIVERY.strip("`")}}}`: pending again, same id; '
        "`conflict` (409) if pending",
        http=Http("POST", "/v1/deliveries/{delivery_id}/redeliver", "redeliver", body=False),
        authorize=trusted,
    ),
)


__all__ = ["HOOKS_COMMANDS"]
