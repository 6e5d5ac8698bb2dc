"""Transaction functions for webhooks: subscriptions, the outbox rows and their delivery log."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from runtime.errors import Conflict, NotFound
from runtime.storage.hooks_store import (
    AttemptOutcome,
    ClaimedDelivery,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    WebhookEvent,
    WebhookSubscription,
)
from runtime.storage.sql.core import Conn, after_clause, scope_clause
from runtime.storage.sql.rows import Row, new_id
from runtime.storage.sql.timers_tx import next_token


def encode_events(events: Sequence[WebhookEvent]) -> str:
    # Commas on both sides: the outbox triggers match `,<event>,` in it.
    return "," + ",".join(sorted({WebhookEvent(event).value for event in events})) + ","


def subscription_from_row(row: Row) -> WebhookSubscription:
    events = tuple(WebhookEvent(name) for name in row["events"].strip(",").split(",") if name)
    return WebhookSubscription(
        id=row["id"],
        scope=row["scope"],
        url=row["url"],
        events=events,
        enabled=bool(row["enabled"]),
        created_by=row["created_by"],
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
    )


def delivery_from_row(row: Row) -> Delivery:
    fields = {name: row[name] for name in Delivery.model_fields if name in row}
    return Delivery(**fields)


async def create_subscription(
    conn: Conn,
    scope: str,
    url: str,
    events: Sequence[WebhookEvent],
    secret: str,
    created_by: str,
    enabled: bool,
    per_scope: int | None,
) -> WebhookSubscription:
    if per_scope is not None:
        count = await conn.fetchval(
            "SELECT COUNT(*) FROM webhook_subscriptions WHERE scope = $1", scope
        )
        if int(count) >= per_scope:
            raise Conflict(f"scope {scope} has {per_scope} webhooks, the most it may have")
    now = await conn.now()
    row = await conn.fetchrow(
        "INSERT INTO webhook_subscriptions (id, scope, url, events, secret, enabled, created_by,"
        " created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8) RETURNING *",
        new_id("wh"),
        scope,
        url,
        encode_events(events),
        secret,
        enabled,
        created_by,
        now,
    )
    assert row is not None
    return subscription_from_row(row)


async def _subscription(conn: Conn, scopes: Collection[str], subscription_id: str) -> Row:
    clause, values = scope_clause("scope", scopes, 2)
    row = await conn.fetchrow(
        f"SELECT * FROM webhook_subscriptions WHERE id = $1 AND {clause}",
        subscription_id,
        *values,
    )
    if row is None:
        raise NotFound(f"webhook {subscription_id} not found")
    return row


async def list_subscriptions(
    conn: Conn, scopes: Collection[str], limit: int, after: str | None = None
) -> list[WebhookSubscription]:
    """Oldest first, then by id; `after` (a `created_cursor`) pages on."""
    clause, args = scope_clause("scope", scopes, 2)
    args = [limit, *args]
    page = after_clause(args, after, "created_at", "id")
    rows = await conn.fetch(
        f"SELECT * FROM webhook_subscriptions WHERE {clause}{page} ORDER BY created_at, id"
        " LIMIT $1",
        *args,
    )
    return [subscription_from_row(row) for row in rows]


async def update_subscription(
    conn: Conn,
    scopes: Collection[str],
    subscription_id: str,
    enabled: bool | None,
    url: str | None,
    events: Sequence[WebhookEvent] | None,
) -> WebhookSubscription:
    row = await _subscription(conn, scopes, subscription_id)
    updated = await conn.fetchrow(
        "UPDATE webhook_subscriptions SET enabled = $2, url = $3, events = $4, updated_at = $5"
        " WHERE id = $1 RETURNING *",
        subscription_id,
        bool(row["enabled"]) if enabled is None else enabled,
        row["url"] if url is None else url,
        row["events"] if events is None else encode_events(events),
        await conn.now(),
    )
    assert updated is not None
    return subscription_from_row(updated)


async def delete_subscription(conn: Conn, scopes: Collection[str], subscription_id: str) -> None:
    await _subscription(conn, scopes, subscription_id)
    await conn.execute("DELETE FROM webhook_subscriptions WHERE id = $1", subscription_id)


async def record_event(
    conn: Conn,
    scope: str,
    event: WebhookEvent,
    *,
    thread_id: str | None = None,
    run_id: str | None = None,
    action_id: str | None = None,
    message_id: str | None = None,
    detail: str | None = None,
) -> None:
    """The outbox insert of an event a transaction function reports itself (the others are
    written by the triggers of migration 0011): one row per enabled subscription of `scope`
    that asked for `event`, in the caller's transaction."""
    rows = await conn.fetch(
        "SELECT id FROM webhook_subscriptions WHERE scope = $1 AND enabled = TRUE"
        " AND events LIKE $2",
        scope,
        f"%,{event.value},%",
    )
    now = await conn.now()
    for row in rows:
        await conn.execute(
            "INSERT INTO webhook_deliveries (id, subscription_id, scope, event_type, thread_id,"
            " run_id, action_id, message_id, detail, occurred_at, next_attempt_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10)",
            new_id("msg"),
            row["id"],
            scope,
            event.value,
            thread_id,
            run_id,
            action_id,
            message_id,
            detail,
            now,
        )


async def list_deliveries(
    conn: Conn,
    scopes: Collection[str],
    subscription_id: str,
    state: DeliveryState | None,
    limit: int,
    after: str | None = None,
) -> list[Delivery]:
    """Oldest first, then by id; `after` (a `delivery_cursor`) pages on."""
    await _subscription(conn, scopes, subscription_id)
    sql = "SELECT * FROM webhook_deliveries WHERE subscription_id = $1"
    args: list[object] = [subscription_id, limit]
    if state is not None:
        args.append(state.value)
        sql += f" AND state = ${len(args)}"
    sql += after_clause(args, after, "occurred_at", "id")
    rows = await conn.fetch(sql + " ORDER BY occurred_at, id LIMIT $2", *args)
    return [delivery_from_row(row) for row in rows]


async def _delivery(conn: Conn, scopes: Collection[str], delivery_id: str) -> Row:
    clause, values = scope_clause("scope", scopes, 2)
    row = await conn.fetchrow(
        f"SELECT * FROM webhook_deliveries WHERE id = $1 AND {clause}", delivery_id, *values
    )
    if row is None:
        raise NotFound(f"delivery {delivery_id} not found")
    return row


async def attempts(conn: Conn, scopes: Collection[str], delivery_id: str) -> list[DeliveryAttempt]:
    await _delivery(conn, scopes, delivery_id)
    rows = await conn.fetch(
        "SELECT * FROM webhook_attempts WHERE delivery_id = $1 ORDER BY attempt", delivery_id
    )
    return [DeliveryAttempt(**row) for row in rows]


async def redeliver(conn: Conn, scopes: Collection[str], delivery_id: str) -> Delivery:
    """A dead (or delivered) delivery pending again, same id, its retry age restarted."""
    row = await _delivery(conn, scopes, delivery_id)
    if row["state"] == DeliveryState.PENDING:
        raise Conflict(f"delivery {delivery_id} is pending already")
    now = await conn.now()
    updated = await conn.fetchrow(
        "UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = $2, retry_from = $2,"
        " owner = NULL, token = NULL, lease_until = NULL WHERE id = $1 RETURNING *",
        delivery_id,
        now,
    )
    assert updated is not None
    return delivery_from_row(updated)


def _due(now: str) -> str:
    """The pending deliveries (`d`) of enabled subscriptions (`s`) due at `now` (SQL) with
    their lease free or expired: what `any_due` asks for and `claim` leases."""
    return (
        "FROM webhook_deliveries d JOIN webhook_subscriptions s ON s.id = d.subscription_id"
        f" WHERE d.state = 'pending' AND d.next_attempt_at <= {now} AND s.enabled = TRUE"
        f" AND (d.lease_until IS NULL OR d.lease_until <= {now})"
    )


async def any_due(conn: Conn) -> bool:
    """Whether some delivery `claim` would lease is due: one statement, as `timers_tx.any_due`."""
    now, args = conn.now_expression(1)
    return await conn.fetchrow(f"SELECT 1 AS due {_due(now)} LIMIT 1", *args) is not None


async def claim(conn: Conn, owner: str, ttl: float, limit: int) -> list[ClaimedDelivery]:
    """Lease up to `limit` due deliveries of enabled subscriptions, oldest event first."""
    now = await conn.now()
    skip = " FOR UPDATE OF d SKIP LOCKED" if conn.dialect.thread_lock else ""
    rows = await conn.fetch(
        f"SELECT d.*, s.url AS url_, s.secret AS secret_ {_due('$1')}"
        f" ORDER BY d.occurred_at, d.id LIMIT $2{skip}",
        now,
        limit,
    )
    claimed = []
    for row in rows:
        token = await next_token(conn)
        await conn.execute(
            "UPDATE webhook_deliveries SET owner = $2, token = $3, lease_until = $4 WHERE id = $1",
            row["id"],
            owner,
            token,
            now + ttl,
        )
        claimed.append(
            ClaimedDelivery(
                delivery=delivery_from_row(row),
                url=row["url_"],
                secret=row["secret_"],
                token=token,
            )
        )
    return claimed


async def record_attempt(
    conn: Conn, claimed: ClaimedDelivery, owner: str, outcome: AttemptOutcome
) -> bool:
    """Log one attempt and move the delivery on (delivered, retried later, or dead); False,
    and nothing written, where the claim's token no longer holds."""
    lock = " FOR UPDATE" if conn.dialect.thread_lock else ""
    row = await conn.fetchrow(
        f"SELECT attempts FROM webhook_deliveries WHERE id = $1 AND token = $2{lock}",
        claimed.delivery.id,
        claimed.token,
    )
    if row is None:
        return False
    now = await conn.now()
    attempt = int(row["attempts"]) + 1
    await conn.execute(
        "INSERT INTO webhook_attempts (delivery_id, attempt, started_at, status_code, latency_ms,"
        " error, owner) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        claimed.delivery.id,
        attempt,
        now - outcome.latency_ms / 1000,
        outcome.status_code,
        outcome.latency_ms,
        outcome.error,
        owner,
    )
    if outcome.delivered:
        state, next_at = DeliveryState.DELIVERED, now
    elif outcome.retry_in is not None:
        state, next_at = DeliveryState.PENDING, now + outcome.retry_in
    else:
        state, next_at = DeliveryState.DEAD, now
    await conn.execute(
        "UPDATE webhook_deliveries SET attempts = $2, state = $3, next_attempt_at = $4,"
        " last_status = $5, last_error = $6, delivered_at = $7, owner = NULL, token = NULL,"
        " lease_until = NULL WHERE id = $1",
        claimed.delivery.id,
        attempt,
        state.value,
        next_at,
        outcome.status_code,
        outcome.error,
        now if outcome.delivered else None,
    )
    return True


__all__ = [
    "claim",
    "create_subscription",
    "encode_events",
    "record_attempt",
    "record_event",
    "redeliver",
]
