"""API tokens: the principal of a live token, which of many tokens are still live, and their
administration: list tokens (never their hashes), revoke by id, mark last use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.domain import Principal, Role
from runtime.errors import Conflict
from runtime.storage.sql.core import Conn, placeholders
from runtime.storage.sql.rows import loads
from runtime.storage.token_admin import TOKEN_ID_CHARS, TokenInfo

_ACTIVE = "revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $1)"
# Hashes per statement: well under SQLite's 32 766 parameters and Postgres' 65 535.
_LIVE_CHUNK = 1000


async def live_tokens(conn: Conn, hashes: Sequence[str]) -> set[str]:
    """The hashes among `hashes` of tokens principal_for_token would accept now."""
    now = await conn.now()
    live: set[str] = set()
    for start in range(0, len(hashes), _LIVE_CHUNK):
        chunk = hashes[start : start + _LIVE_CHUNK]
        rows = await conn.fetch(
            f"SELECT token_hash FROM api_tokens WHERE {_ACTIVE}"
            f" AND token_hash IN ({placeholders(2, len(chunk))})",
            now,
            *chunk,
        )
        live.update(str(row["token_hash"]) for row in rows)
    return live


async def principal_for_token(conn: Conn, token_hash: str) -> Principal | None:
    granted = await token_grant(conn, token_hash)
    return None if granted is None else granted[0]


async def token_grant(conn: Conn, token_hash: str) -> tuple[Principal, float | None] | None:
    """The principal of a live token and the seconds it has left (None: it never expires).
    Expiry on the database clock, like leases: every gateway agrees on when a token ends.
    Read in the statement where the clock needs a query (Postgres): one round trip per
    authenticated request, not a clock read before it."""
    args: list[Any] = [token_hash]
    if conn.dialect.local_clock is None:
        now = conn.dialect.now_sql
    else:
        now = "$2"
        args.append(await conn.now())
    row = await conn.fetchrow(
        f"SELECT subject, role, scopes, display_name, groups, expires_at, {now} AS now_"
        " FROM api_tokens WHERE token_hash = $1"
        f" AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > {now})",
        *args,
    )
    if row is None:
        return None
    principal = Principal(
        subject=row["subject"],
        role=Role(row["role"]),
        scopes=frozenset(loads(row["scopes"])),
        display_name=row["display_name"],
        groups=frozenset(loads(row["groups"])),
    )
    expires_at = row["expires_at"]
    return principal, None if expires_at is None else float(expires_at) - float(row["now_"])


async def create_token(
    conn: Conn,
    token_hash: str,
    subject: str,
    role: Role,
    scopes_json: str,
    expires_in: float | None = None,
    display_name: str | None = None,
    groups_json: str = "[]",
) -> None:
    now = await conn.now()
    inserted = await conn.fetchval(
        "INSERT INTO api_tokens"
        " (token_hash, subject, role, scopes, created_at, expires_at, display_name, groups)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (token_hash) DO NOTHING"
        " RETURNING token_hash",
        token_hash,
        subject,
        role.value,
        scopes_json,
        now,
        None if expires_in is None else now + expires_in,
        display_name,
        groups_json,
    )
    if inserted is None:
        raise Conflict("a token with this hash already exists")


async def token_expires_in(conn: Conn, token_hash: str) -> float | None:
    """Seconds until the token expires on the database clock (0 once it has); None when it
    never expires or does not exist."""
    expires_at = await conn.fetchval(
        "SELECT expires_at FROM api_tokens WHERE token_hash = $1", token_hash
    )
    if expires_at is None:
        return None
    return max(0.0, float(expires_at) - await conn.now())


async def revoke_token(conn: Conn, token_hash: str) -> bool:
    """Mark the token revoked; False when no such (unrevoked) token exists."""
    revoked = await conn.fetchval(
        "UPDATE api_tokens SET revoked_at = $2 WHERE token_hash = $1 AND revoked_at IS NULL"
        " RETURNING token_hash",
        token_hash,
        await conn.now(),
    )
    if revoked is None:
        return False
    # In the same transaction: a reader that sees the same total has seen no revocation since.
    await conn.execute(
        "INSERT INTO token_revocations (id, total) VALUES (1, 1)"
        " ON CONFLICT (id) DO UPDATE SET total = token_revocations.total + 1"
    )
    return True


async def revocation_count(conn: Conn) -> int:
    """How many tokens were ever revoked (it moves exactly when one is)."""
    return int(await conn.fetchval("SELECT total FROM token_revocations WHERE id = 1") or 0)


async def list_tokens(conn: Conn) -> list[TokenInfo]:
    """Every token neither revoked nor expired, oldest first."""
    rows = await conn.fetch(
        "SELECT token_hash, subject, role, scopes, display_name, groups, created_at, expires_at,"
        f" last_used_at FROM api_tokens WHERE {_ACTIVE} ORDER BY created_at, token_hash",
        await conn.now(),
    )
    return [
        TokenInfo(
            id=row["token_hash"][:TOKEN_ID_CHARS],
            subject=row["subject"],
            role=Role(row["role"]),
            scopes=sorted(loads(row["scopes"])),
            name=row["display_name"],
            groups=loads(row["groups"]),
            created_at=row["created_at"],
            expires_at=row["expires_at"],
            last_used_at=row["last_used_at"],
        )
        for row in rows
    ]


async def active_hash_of_id(conn: Conn, token_id: str) -> str | None:
    """The hash of the active token `token_id` names (a prefix of it), if exactly one."""
    # A range on the primary key: hashes are lowercase hex, and 'g' sorts after every digit.
    rows = await conn.fetch(
        "SELECT token_hash FROM api_tokens WHERE token_hash >= $2 AND token_hash < $3"
        f" AND {_ACTIVE} LIMIT 2",
        await conn.now(),
        token_id,
        token_id + "g",
    )
    return str(rows[0]["token_hash"]) if len(rows) == 1 else None


async def touch_token(conn: Conn, token_hash: str, resolution: float) -> None:
    """Mark the token used now, unless it was marked within `resolution` seconds (then this
    matches no row and writes nothing)."""
    now = await conn.now()
    await conn.execute(
        "UPDATE api_tokens SET last_used_at = $2 WHERE token_hash = $1"
        " AND (last_used_at IS NULL OR last_used_at < $3)",
        token_hash,
        now,
        now - resolution,
    )
