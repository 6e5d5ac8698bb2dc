"""The principals half of `SqlStore`: API tokens (create, revoke, what a token grants, which of
many are live, their administration) and the database clock, one transaction function each."""

from __future__ import annotations

from collections.abc import Collection

from runtime.domain import Principal, Role
from runtime.errors import InvalidInput
from runtime.storage.input_checks import check_display_name, check_groups, check_token
from runtime.storage.sql import tokens_tx
from runtime.storage.sql.core import normalize_scopes
from runtime.storage.sql.rows import dumps
from runtime.storage.sql.transactions import SqlTransactions
from runtime.storage.token_admin import LAST_USED_RESOLUTION, TOKEN_ID_CHARS, TokenInfo


class SqlTokenStore(SqlTransactions):
    """`TokenStore` over the SQL backends (`SqlStore` adds threads, runs and the rest)."""

    async def create_token(
        self,
        token_hash: str,
        subject: str,
        role: Role,
        scopes: Collection[str],
        expires_in: float | None = None,
        display_name: str | None = None,
        groups: Collection[str] = (),
    ) -> None:
        role = check_token(token_hash, subject, role)
        if expires_in is not None and not expires_in > 0:
            raise InvalidInput("expires_in must be a positive number of seconds")
        name = check_display_name(display_name)
        scopes_json = dumps(list(normalize_scopes(scopes)))
        groups_json = dumps(check_groups(groups))
        await self._write(
            lambda conn: tokens_tx.create_token(
                conn, token_hash, subject, role, scopes_json, expires_in, name, groups_json
            )
        )

    async def revoke_token(self, token_hash: str) -> bool:
        return await self._write(lambda conn: tokens_tx.revoke_token(conn, token_hash))

    async def principal_for_token(self, token_hash: str) -> Principal | None:
        # One statement, consistent on its own: no BEGIN and COMMIT around it.
        return await self._read_statements(
            lambda conn: tokens_tx.principal_for_token(conn, token_hash)
        )

    async def live_tokens(self, token_hashes: Collection[str]) -> set[str]:
        hashes = list(dict.fromkeys(token_hashes))
        if not hashes:
            return set()
        return await self._read(lambda conn: tokens_tx.live_tokens(conn, hashes))

    async def revocation_count(self) -> int:
        return await self._read_statements(tokens_tx.revocation_count)

    async def token_grant(self, token_hash: str) -> tuple[Principal, float | None] | None:
        # One statement too: the principal and the seconds its token has left.
        return await self._read_statements(lambda conn: tokens_tx.token_grant(conn, token_hash))

    async def token_expires_in(self, token_hash: str) -> float | None:
        return await self._read(lambda conn: tokens_tx.token_expires_in(conn, token_hash))

    async def list_tokens(self) -> list[TokenInfo]:
        return await self._read(tokens_tx.list_tokens)

    async def token_hash_of_id(self, token_id: str) -> str | None:
        if not (len(token_id) == TOKEN_ID_CHARS and all(c in "0123456789abcdef" for c in token_id)):
            return None
        return await self._read(lambda conn: tokens_tx.active_hash_of_id(conn, token_id))

    async def touch_token(self, token_hash: str) -> None:
        await self._write(
            lambda conn: tokens_tx.touch_token(conn, token_hash, LAST_USED_RESOLUTION)
        )

    async def db_time(self) -> float:
        return await self._read(lambda conn: conn.now())


__all__ = ["SqlTokenStore"]
