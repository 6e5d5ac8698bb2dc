"""`SqlHooks`: the `HooksStore` over a `SqlStore`'s dialect and pool, one transaction per method."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from runtime.errors import InvalidInput
from runtime.storage.hooks_store import (
    AttemptOutcome,
    ClaimedDelivery,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    DueTimer,
    FireResult,
    Schedule,
    ScheduleFire,
    ScheduleSpec,
    WebhookEvent,
    WebhookSubscription,
)
from runtime.storage.input_checks import check_owner, check_ttl
from runtime.storage.retention import RetentionPolicy
from runtime.storage.schedule_rules import check_spec, next_cron_time
from runtime.storage.sql import retention_tx, schedules_tx, timers_tx, webhooks_tx
from runtime.storage.sql.core import Conn, thread_row
from runtime.storage.sql.sql_store import SqlStore
from runtime.storage.sql.transactions import SqlTransactions
from runtime.storage.store import AdmissionLimits
from runtime.storage.thread_query import read_cursor


def _limit(limit: int) -> int:
    return max(1, min(int(limit), 500))


class SqlHooks(SqlTransactions):
    """Shares the store's pool (opened and closed by the store); the tables are migration
    0011's. Per-scope caps of schedules and webhooks: None is unbounded."""

    def __init__(
        self,
        store: SqlStore,
        *,
        schedules_per_scope: int | None = None,
        webhooks_per_scope: int | None = None,
    ) -> None:
        super().__init__(store.dialect, store.pool)
        self.schedules_per_scope = schedules_per_scope
        self.webhooks_per_scope = webhooks_per_scope

    async def open(self) -> None:
        """Nothing: the store opens the shared pool and applies the migrations."""

    async def close(self) -> None:
        """Nothing: the store closes the shared pool."""

    # --- timers -------------------------------------------------------------------------

    async def claim_timers(self, owner: str, ttl: float, limit: int) -> list[DueTimer]:
        owner, ttl = check_owner(owner), check_ttl(ttl)
        # A loop polls this several times a second: idle, one read statement, no transaction.
        if not await self._read_statements(timers_tx.any_due):
            return []
        return await self._write(lambda conn: timers_tx.claim(conn, owner, ttl, _limit(limit)))

    async def fire_timer(
        self, timer: DueTimer, limits: AdmissionLimits | None = None
    ) -> FireResult:
        return await self._write(lambda conn: timers_tx.fire(conn, timer, limits))

    async def set_retention(self, policy: RetentionPolicy | None) -> None:
        await self._write(lambda conn: retention_tx.set_policy(conn, policy))

    async def expire_threads(self, updated_before: float, limit: int) -> list[str]:
        cutoff, batch = float(updated_before), _limit(limit)
        return await self._write(lambda conn: retention_tx.expire_threads(conn, cutoff, batch))

    # --- schedules ----------------------------------------------------------------------

    async def create_schedule(self, spec: ScheduleSpec, created_by: str) -> Schedule:
        async def create(conn: Conn) -> Schedule:
            if spec.thread_id is not None:
                # Scope first: a thread of another scope is not found, whatever else is wrong.
                await thread_row(conn, spec.thread_id, [spec.scope])
            first = check_spec(spec, await conn.now())
            return await schedules_tx.create(
                conn, spec, created_by, first, self.schedules_per_scope
            )

        return await self._write(create)

    async def list_schedules(
        self, scopes: Collection[str], limit: int = 100, after: str | None = None
    ) -> list[Schedule]:
        return await self._read(
            lambda conn: schedules_tx.list_schedules(conn, scopes, _limit(limit), after)
        )

    async def get_schedule(self, scopes: Collection[str], schedule_id: str) -> Schedule:
        async def get(conn: Conn) -> Schedule:
            return schedules_tx.schedule_from_row(await schedules_tx.get(conn, scopes, schedule_id))

        return await self._read(get)

    async def set_schedule_paused(
        self, scopes: Collection[str], schedule_id: str, paused: bool
    ) -> Schedule:
        async def change(conn: Conn) -> Schedule:
            row = await schedules_tx.get(conn, scopes, schedule_id)
            now = await conn.now()
            resume_at: float | None
            if row["cron"] is not None:
                resume_at = next_cron_time(row["cron"], row["timezone"], now)
            else:
                resume_at = float(row["run_at"])
            return await schedules_tx.set_paused(conn, scopes, schedule_id, paused, resume_at)

        return await self._write(change)

    async def delete_schedule(self, scopes: Collection[str], schedule_id: str) -> None:
        await self._write(lambda conn: schedules_tx.delete(conn, scopes, schedule_id))

    async def schedule_fires(
        self, scopes: Collection[str], schedule_id: str, limit: int = 100, after: str | None = None
    ) -> list[ScheduleFire]:
        if after is not None:
            read_cursor(after)  # a bad cursor is refused before any transaction
        return await self._read(
            lambda conn: schedules_tx.fires(conn, scopes, schedule_id, _limit(limit), after)
        )

    # --- webhooks -----------------------------------------------------------------------

    async def create_subscription(
        self,
        scope: str,
        url: str,
        events: Sequence[WebhookEvent],
        secret: str,
        created_by: str,
        enabled: bool = True,
    ) -> WebhookSubscription:
        if not events:
            raise InvalidInput("a webhook needs at least one event type", field="events")
        return await self._write(
            lambda conn: webhooks_tx.create_subscription(
                conn, scope, url, events, secret, created_by, enabled, self.webhooks_per_scope
            )
        )

    async def list_subscriptions(
        self, scopes: Collection[str], limit: int = 100, after: str | None = None
    ) -> list[WebhookSubscription]:
        return await self._read(
            lambda conn: webhooks_tx.list_subscriptions(conn, scopes, _limit(limit), after)
        )

    async def update_subscription(
        self,
        scopes: Collection[str],
        subscription_id: str,
        *,
        enabled: bool | None = None,
        url: str | None = None,
        events: Sequence[WebhookEvent] | None = None,
    ) -> WebhookSubscription:
        if events is not None and not events:
            raise InvalidInput("a webhook needs at least one event type", field="events")
        return await self._write(
            lambda conn: webhooks_tx.update_subscription(
                conn, scopes, subscription_id, enabled, url, events
            )
        )

    async def delete_subscription(self, scopes: Collection[str], subscription_id: str) -> None:
        await self._write(
            lambda conn: webhooks_tx.delete_subscription(conn, scopes, subscription_id)
        )

    async def list_deliveries(
        self,
        scopes: Collection[str],
        subscription_id: str,
        *,
        state: DeliveryState | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[Delivery]:
        if after is not None:
            read_cursor(after)  # a bad cursor is refused before any transaction
        return await self._read(
            lambda conn: webhooks_tx.list_deliveries(
                conn, scopes, subscription_id, state, _limit(limit), after
            )
        )

    async def delivery_attempts(
        self, scopes: Collection[str], delivery_id: str
    ) -> list[DeliveryAttempt]:
        return await self._read(lambda conn: webhooks_tx.attempts(conn, scopes, delivery_id))

    async def redeliver(self, scopes: Collection[str], delivery_id: str) -> Delivery:
        return await self._write(lambda conn: webhooks_tx.redeliver(conn, scopes, delivery_id))

    async def claim_deliveries(self, owner: str, ttl: float, limit: int) -> list[ClaimedDelivery]:
        owner, ttl = check_owner(owner), check_ttl(ttl)
        if not await self._read_statements(webhooks_tx.any_due):  # as `claim_timers`
            return []
        return await self._write(lambda conn: webhooks_tx.claim(conn, owner, ttl, _limit(limit)))

    async def record_attempt(
        self, claimed: ClaimedDelivery, owner: str, outcome: AttemptOutcome
    ) -> bool:
        return await self._write(
            lambda conn: webhooks_tx.record_attempt(conn, claimed, owner, outcome)
        )


__all__ = ["SqlHooks"]
