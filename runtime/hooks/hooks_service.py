"""What the command table calls for schedules and webhooks: scope and role checks, the store."""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from typing import Any

from runtime.domain import Principal
from runtime.errors import Forbidden, InvalidInput
from runtime.hooks.outbound import Network, resolve
from runtime.service.companions import Companions
from runtime.service.thread_service import require_trusted
from runtime.storage.hooks_store import (
    DEFAULT_EVENTS,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    HooksStore,
    Schedule,
    ScheduleFire,
    ScheduleSpec,
    WebhookEvent,
    WebhookSubscription,
)


def scope_for(principal: Principal, scope: str | None) -> str:
    """The scope a new schedule or webhook belongs to: the one named, which the caller must
    hold, or the token's only one."""
    if scope is None:
        if len(principal.scopes) != 1:
            raise InvalidInput("this token has several scopes: say which one with 'scope'")
        return next(iter(principal.scopes))
    if scope not in principal.scopes:
        raise Forbidden(f"scope {scope} is not one of this token's")
    return scope


def new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and 24 random bytes in base64."""
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


class HooksService:
    """Schedules: any role of the scope (a schedule sends input as a user would; its fires
    are admitted under the scope's quotas). Webhooks: role backend or admin."""

    def __init__(self, store: HooksStore, *, allow: Sequence[Network] = ()) -> None:
        self.store = store
        self.allow = tuple(allow)

    # --- schedules ----------------------------------------------------------------------

    async def create_schedule(self, principal: Principal, **fields: Any) -> Schedule:
        fields["scope"] = scope_for(principal, fields.get("scope"))
        spec = ScheduleSpec(**fields)
        return await self.store.create_schedule(spec, principal.subject)

    async def list_schedules(
        self, principal: Principal, limit: int, cursor: str | None = None
    ) -> list[Schedule]:
        return await self.store.list_schedules(principal.scopes, limit, cursor)

    async def get_schedule(self, principal: Principal, schedule_id: str) -> Schedule:
        return await self.store.get_schedule(principal.scopes, schedule_id)

    async def pause_schedule(
        self, principal: Principal, schedule_id: str, paused: bool
    ) -> Schedule:
        return await self.store.set_schedule_paused(principal.scopes, schedule_id, paused)

    async def delete_schedule(self, principal: Principal, schedule_id: str) -> None:
        await self.store.delete_schedule(principal.scopes, schedule_id)

    async def schedule_fires(
        self, principal: Principal, schedule_id: str, limit: int, after: str | None = None
    ) -> list[ScheduleFire]:
        return await self.store.schedule_fires(principal.scopes, schedule_id, limit, after)

    # --- webhooks -----------------------------------------------------------------------

    async def create_webhook(
        self,
        principal: Principal,
        *,
        url: str,
        events: Sequence[WebhookEvent] | None,
        secret: str | None,
        enabled: bool,
        scope: str | None,
    ) -> tuple[WebhookSubscription, str]:
        """The subscription and its secret (shown once, here: never listed)."""
        require_trusted(principal)
        await resolve(url, self.allow)  # refused now rather than at the first event
        secret = secret or new_secret()
        subscription = await self.store.create_subscription(
            scope_for(principal, scope),
            url,
            DEFAULT_EVENTS if events is None else events,
            secret,
            principal.subject,
            enabled,
        )
        return subscription, secret

    async def list_webhooks(
        self, principal: Principal, limit: int, cursor: str | None = None
    ) -> list[WebhookSubscription]:
        require_trusted(principal)
        return await self.store.list_subscriptions(principal.scopes, limit, cursor)

    async def update_webhook(
        self,
        principal: Principal,
        subscription_id: str,
        *,
        enabled: bool | None,
        url: str | None,
        events: Sequence[WebhookEvent] | None,
    ) -> WebhookSubscription:
        require_trusted(principal)
        if url is not None:
            await resolve(url, self.allow)
        return await self.store.update_subscription(
            principal.scopes, subscription_id, enabled=enabled, url=url, events=events
        )

    async def delete_webhook(self, principal: Principal, subscription_id: str) -> None:
        require_trusted(principal)
        await self.store.delete_subscription(principal.scopes, subscription_id)

    async def deliveries(
        self,
        principal: Principal,
        subscription_id: str,
        state: DeliveryState | None,
        limit: int,
        after: str | None = None,
    ) -> list[Delivery]:
        require_trusted(principal)
        return await self.store.list_deliveries(
            principal.scopes, subscription_id, state=state, limit=limit, after=after
        )

    async def attempts(self, principal: Principal, delivery_id: str) -> list[DeliveryAttempt]:
        require_trusted(principal)
        return await self.store.delivery_attempts(principal.scopes, delivery_id)

    async def redeliver(self, principal: Principal, delivery_id: str) -> Delivery:
        require_trusted(principal)
        return await self.store.redeliver(principal.scopes, delivery_id)


# The service of each ThreadService, registered by the app (runtime/service/companions.py).
_HOOKS: Companions[HooksService] = Companions("schedules and webhooks are")
register_hooks = _HOOKS.register
hooks_for = _HOOKS.of


__all__ = ["HooksService", "hooks_for", "new_secret", "register_hooks", "scope_for"]
