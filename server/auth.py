"""Bearer tokens: minting (only the sha256 hash is stored) and lookup; roles are the service's."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Collection, Mapping

from runtime.domain import Principal, Role
from runtime.errors import ThreadlineError
from runtime.storage.store import TokenStore


class Unauthorized(ThreadlineError):
    """A missing, malformed or unknown bearer token."""

    code = "unauthorized"


TOKEN_PREFIX = "tl_"
# token_urlsafe(32) is 43 characters; anything much longer is not one of ours.
_MAX_TOKEN_CHARS = 128


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


async def create_token(
    store: TokenStore,
    *,
    subject: str,
    role: Role,
    scopes: Collection[str],
    expires_in: float | None = None,
    display_name: str | None = None,
) -> str:
    """Mint a token for `subject` (valid `expires_in` seconds, or until revoked; shown to others
    as `display_name`, else the subject); the plain token is returned once and never stored."""
    if not scopes:
        raise ValueError("a token needs at least one scope")
    token = new_token()
    await store.create_token(
        hash_token(token), subject, role, frozenset(scopes), expires_in, display_name
    )
    return token


def token_key(token: str) -> str:
    """A short key naming a token in quota counters and revocations; not enough to look the
    token up (a prefix of its hash)."""
    return token_key_of_hash(hash_token(token))


def token_key_of_hash(token_hash: str) -> str:
    return token_hash[:24]


# Websockets: the client offers `threadline.v1` and `bearer.<token>` as subprotocols and the
# server answers `threadline.v1`, so the token is in neither the URL nor an echoed header
# (docs/protocol.md, "Authentication"). Tokens are URL-safe, so always a valid subprotocol.
SUBPROTOCOL = "threadline.v1"
BEARER_SUBPROTOCOL = "bearer."


def websocket_credentials(
    subprotocols: Collection[str], headers: Mapping[str, str], query_token: str | None
) -> tuple[str | None, str | None]:
    """(token, subprotocol to answer) of a websocket upgrade: a `bearer.` subprotocol first,
    then an `Authorization: Bearer` header, then `?token=` (older clients)."""
    answer = SUBPROTOCOL if SUBPROTOCOL in subprotocols else None
    for offered in subprotocols:
        if offered.startswith(BEARER_SUBPROTOCOL):
            return offered[len(BEARER_SUBPROTOCOL) :] or None, answer
    return bearer_token(headers) or query_token, answer


def bearer_token(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


async def authenticate(store: TokenStore, token: str | None) -> Principal:
    """The principal of `token`; `Unauthorized` for a missing, malformed or unknown token."""
    if not token:
        raise Unauthorized("a bearer token is required")
    if not token.startswith(TOKEN_PREFIX) or len(token) > _MAX_TOKEN_CHARS:
        raise Unauthorized("the token is invalid")
    principal = await store.principal_for_token(hash_token(token))
    if principal is None:
        raise Unauthorized("the token is invalid")
    return principal
