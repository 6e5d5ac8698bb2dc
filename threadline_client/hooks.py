"""Schedules and webhooks from the client: typed views and the calls (`HooksCalls`, mixed in)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import Field

from threadline_client.models import WireModel

MissedFire = Literal["run_once", "skip"]


class Schedule(WireModel):
    id: str
    scope: str
    thread_id: str | None = None
    new_thread: bool = False
    cron: str | None = None
    timezone: str = "UTC"
    run_at: float | None = None
    text: str
    policy: str = "enqueue"
    missed: MissedFire = "run_once"
    misfire_grace: float = 60.0
    status: Literal["active", "paused", "done"]
    next_fire_at: float | None = None
    last_fire_at: float | None = None


class ScheduleFire(WireModel):
    fire_at: float
    fired_at: float
    outcome: str
    thread_id: str | None = None
    run_id: str | None = None
    queued_item_id: str | None = None
    detail: str | None = None


class Webhook(WireModel):
    id: str
    scope: str
    url: str
    events: list[str]
    enabled: bool
    secret: str | None = None  # only in the answer that created it


class Delivery(WireModel):
    id: str  # the `webhook-id` the receiver sees
    event_type: str
    state: Literal["pending", "delivered", "dead"]
    attempts: int
    last_status: int | None = None
    last_error: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)


class DeliveryAttempt(WireModel):
    attempt: int
    started_at: float
    status_code: int | None = None
    latency_ms: float | None = None
    error: str | None = None


class HooksCalls:
    """The schedule and webhook routes (docs/protocol.md, "Schedules", "Webhooks")."""

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        raise NotImplementedError  # ThreadlineClient's

    async def create_schedule(
        self,
        /,
        text: str,
        *,
        thread_id: str | None = None,
        new_thread: bool = False,
        cron: str | None = None,
        timezone: str = "UTC",
        run_at: float | None = None,
        missed: MissedFire = "run_once",
        **fields: Any,
    ) -> Schedule:
        body = {
            "text": text,
            "thread_id": thread_id,
            "new_thread": new_thread,
            "cron": cron,
            "timezone": timezone,
            "run_at": run_at,
            "missed": missed,
            **fields,
        }
        body = {name: value for name, value in body.items() if value is not None}
        answer = await self.request("POST", "/v1/schedules", json=body)
        return Schedule.model_validate(answer["schedule"])

    async def list_schedules(self, limit: int = 100) -> list[Schedule]:
        """The first `limit` schedules the caller may see, oldest first (`schedules`: all)."""
        answer = await self.request("GET", "/v1/schedules", params={"limit": limit})
        return [Schedule.model_validate(item) for item in answer["schedules"]]

    async def schedules(self, *, page_size: int = 100) -> AsyncIterator[Schedule]:
        """Every schedule the caller may see, oldest first, page after page by its cursor."""
        async for item in self._pages("/v1/schedules", "schedules", {"limit": page_size}):
            yield Schedule.model_validate(item)

    async def pause_schedule(self, schedule_id: str) -> Schedule:
        answer = await self.request("POST", f"/v1/schedules/{schedule_id}/pause")
        return Schedule.model_validate(answer["schedule"])

    async def resume_schedule(self, schedule_id: str) -> Schedule:
        answer = await self.request("POST", f"/v1/schedules/{schedule_id}/resume")
        return Schedule.model_validate(answer["schedule"])

    async def delete_schedule(self, schedule_id: str) -> None:
        await self.request("DELETE", f"/v1/schedules/{schedule_id}")

    async def _pages(
        self, path: str, key: str, params: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """The items under `key` of every page of a cursor-paged list, page after page."""
        cursor: str | None = None
        while True:
            page = {**params, "cursor": cursor} if cursor is not None else params
            answer = await self.request("GET", path, params=page)
            for item in answer[key]:
                yield item
            cursor = answer.get("next_cursor")
            if not cursor:
                return

    async def schedule_fires(
        self, schedule_id: str, *, page_size: int = 100
    ) -> AsyncIterator[ScheduleFire]:
        """Every fire of the schedule, newest first, page after page by its cursor."""
        path = f"/v1/schedules/{schedule_id}/fires"
        async for item in self._pages(path, "fires", {"limit": page_size}):
            yield ScheduleFire.model_validate(item)

    async def create_webhook(
        self,
        url: str,
        *,
        events: list[str] | None = None,
        secret: str | None = None,
        enabled: bool = True,
        scope: str | None = None,
    ) -> Webhook:
        body = {"url": url, "events": events, "secret": secret, "enabled": enabled, "scope": scope}
        body = {name: value for name, value in body.items() if value is not None}
        answer = await self.request("POST", "/v1/webhooks", json=body)
        return Webhook.model_validate(answer["webhook"])

    async def list_webhooks(self, limit: int = 100) -> list[Webhook]:
        """The first `limit` subscriptions of the caller's scopes, oldest first (`webhooks`:
        all)."""
        answer = await self.request("GET", "/v1/webhooks", params={"limit": limit})
        return [Webhook.model_validate(item) for item in answer["webhooks"]]

    async def webhooks(self, *, page_size: int = 100) -> AsyncIterator[Webhook]:
        """Every subscription of the caller's scopes, oldest first, page after page."""
        async for item in self._pages("/v1/webhooks", "webhooks", {"limit": page_size}):
            yield Webhook.model_validate(item)

    async def set_webhook_enabled(self, webhook_id: str, enabled: bool) -> Webhook:
        answer = await self.request("POST", f"/v1/webhooks/{webhook_id}", json={"enabled": enabled})
        return Webhook.model_validate(answer["webhook"])

    async def delete_webhook(self, webhook_id: str) -> None:
        await self.request("DELETE", f"/v1/webhooks/{webhook_id}")

    async def deliveries(
        self, webhook_id: str, state: str | None = None, *, page_size: int = 100
    ) -> AsyncIterator[Delivery]:
        """Every delivery of the webhook (in `state`, if given), oldest first, page after
        page by its cursor."""
        params: dict[str, Any] = {"limit": page_size}
        if state is not None:
            params["state"] = state
        path = f"/v1/webhooks/{webhook_id}/deliveries"
        async for item in self._pages(path, "deliveries", params):
            yield Delivery.model_validate(item)

    async def delivery_attempts(self, delivery_id: str) -> list[DeliveryAttempt]:
        answer = await self.request("GET", f"/v1/deliveries/{delivery_id}/attempts")
        return [DeliveryAttempt.model_validate(item) for item in answer["attempts"]]

    async def redeliver(self, delivery_id: str) -> Delivery:
        answer = await self.request("POST", f"/v1/deliveries/{delivery_id}/redeliver")
        return Delivery.model_validate(answer["delivery"])


__all__ = [
    "Delivery",
    "DeliveryAttempt",
    "HooksCalls",
    "Schedule",
    "ScheduleFire",
    "Webhook",
]
