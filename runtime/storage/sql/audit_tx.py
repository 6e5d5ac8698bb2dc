"""Transaction functions of the audit log and decision records: append, chained per scope."""

from __future__ import annotations

from typing import Any

import orjson

from runtime.approvals import ApprovalDecision
from runtime.domain import Origin
from runtime.storage.audit_chain import HASHED, AuditEntry, entry_hash, payload_hash
from runtime.storage.sql.core import Conn

_COLUMNS = (*HASHED, "hash")


async def record_decision(
    conn: Conn, thread_id: str, action_id: str, decision: ApprovalDecision
) -> None:
    """The decision's own row; its primary key (thread, action, subject) is a second guard of
    the one-decision-per-decider rule the thread lock already enforces."""
    await conn.execute(
        "INSERT INTO action_decisions (thread_id, action_id, subject, display_name, approved,"
        " payload, decided_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        thread_id,
        action_id,
        decision.subject,
        decision.display_name,
        decision.approved,
        orjson.dumps(decision.payload).decode(),
        decision.at,
    )


async def append(
    conn: Conn,
    scope: str,
    *,
    event: str,
    thread_id: str,
    action_id: str,
    subject: str,
    display_name: str,
    detail: str,
    payload: dict[str, Any],
    origin: Origin | None,
) -> AuditEntry:
    """Append one entry to `scope`'s chain, in the caller's transaction: it exists if and only
    if what it records does."""
    if conn.dialect.scope_lock is not None:
        # Entries of one scope come from many threads: their chain is appended one at a time.
        await conn.lock(conn.dialect.scope_lock, scope)
    last = await conn.fetchrow(
        "SELECT seq, hash FROM audit_log WHERE scope = $1 ORDER BY seq DESC LIMIT 1", scope
    )
    fields: dict[str, Any] = {
        "scope": scope,
        "seq": 1 if last is None else int(last["seq"]) + 1,
        "event": event,
        "thread_id": thread_id,
        "action_id": action_id,
        "subject": subject,
        "token_id": origin.token_id if origin else None,
        "display_name": display_name,
        "transport": origin.transport if origin else None,
        "client_address": origin.client_address if origin else None,
        "user_agent": origin.user_agent if origin else None,
        "at": await conn.now(),
        "detail": detail,
        "payload_hash": payload_hash(payload),
        "prev_hash": "" if last is None else str(last["hash"]),
    }
    entry = AuditEntry(**fields, hash=entry_hash(fields))
    placeholders = ", ".join(f"${i}" for i in range(1, len(_COLUMNS) + 1))
    await conn.execute(
        f"INSERT INTO audit_log ({', '.join(_COLUMNS)}) VALUES ({placeholders})",
        *(getattr(entry, c) for c in _COLUMNS),
    )
    return entry


async def entries(
    conn: Conn, scope: str, thread_id: str | None, after: int, limit: int
) -> list[AuditEntry]:
    """A page of `scope`'s entries after `seq` `after` (of one thread's: `thread_id`)."""
    columns = ", ".join(_COLUMNS)
    if thread_id is None:
        rows = await conn.fetch(
            f"SELECT {columns} FROM audit_log WHERE scope = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            scope,
            after,
            limit,
        )
    else:
        rows = await conn.fetch(
            f"SELECT {columns} FROM audit_log WHERE scope = $1 AND thread_id = $2 AND seq > $3"
            " ORDER BY seq LIMIT $4",
            scope,
            thread_id,
            after,
            limit,
        )
    return [AuditEntry(**{c: row[c] for c in _COLUMNS}) for row in rows]
