"""Token administration over the store: list tokens without their secrets, revoke by id."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict

from runtime.domain import Role
from runtime.storage.store import TokenStore

# A token's public id: this many leading hex digits of its hash. Enough to name it, not to
# look it up by the secret (the hash is a one-way function of it) nor to forge it.
TOKEN_ID_CHARS = 24


class TokenInfo(BaseModel):
    """One active token as an administrator sees it: never the token, never its whole hash."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str
    subject: str
    role: Role
    scopes: list[str]
    name: str | None
    groups: list[str]  # what approval policies route by
    created_at: float
    expires_at: float | None
    last_used_at: float | None  # to the minute (LAST_USED_RESOLUTION)


# A token's use is recorded at most this often (seconds): a write per minute, not per request.
LAST_USED_RESOLUTION = 60.0


class TokenAdminStore(TokenStore, Protocol):
    async def list_tokens(self) -> list[TokenInfo]:
        """Every token neither revoked nor expired, oldest first."""
        ...

    async def token_hash_of_id(self, token_id: str) -> str | None:
        """The hash of the active token with this id; None when there is none (or several)."""
        ...

    async def touch_token(self, token_hash: str) -> None:
        """Record that the token was used now (at most once per LAST_USED_RESOLUTION)."""
        ...
