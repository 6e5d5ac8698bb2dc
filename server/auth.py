"""Bearer tokens: `tl_` tokens (minted here, stored as a sha256 hash) and issuers' JWTs."""

from __future__ import annotations

import hashlib
import secrets
import time
import weakref
from collections.abc import Collection, Mapping

from runtime.domain import Principal, Role
from runtime.storage.store import TokenStore
from server.auth_errors import Unauthorized as Unauthorized
from server.oidc import Issuers

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


def bearer_token(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


# The issuers a deployment trusts, by its token store: `authenticate(store, token)` stays the
# one "token string -> Principal" function every door (HTTP, event streams, websocket) calls,
# whichever kind of token it is given. Set by the app's lifespan (`trust_issuers`).
_ISSUERS: weakref.WeakKeyDictionary[TokenStore, Issuers] = weakref.WeakKeyDictionary()


def trust_issuers(store: TokenStore, issuers: Issuers | None) -> None:
    """Accept JWTs of `issuers` wherever `store`'s tokens are accepted (None: `tl_` only)."""
    if issuers is None:
        _ISSUERS.pop(store, None)
    else:
        _ISSUERS[store] = issuers


def is_stored_token(token: str) -> bool:
    """A `tl_` token (in storage, revocable there); anything else is an issuer's JWT."""
    return token.startswith(TOKEN_PREFIX)


async def authenticate(store: TokenStore, token: str | None) -> Principal:
    """The principal of `token`; `Unauthorized` (or a subclass naming why) for a missing,
    malformed, unknown, expired or foreign token."""
    if not token:
        raise Unauthorized("a bearer token is required")
    if not is_stored_token(token):
        issuers = _ISSUERS.get(store)
        if issuers is None or token.count(".") != 2:
            raise Unauthorized("the token is invalid")
        return (await issuers.verify(token)).principal
    if len(token) > _MAX_TOKEN_CHARS:
        raise Unauthorized("the token is invalid")
    principal = await store.principal_for_token(hash_token(token))
    if principal is None:
        raise Unauthorized("the token is invalid")
    return principal


async def token_expires_in(store: TokenStore, token: str) -> float | None:
    """Seconds the (authenticated) token has left; None if it never expires. A stored token's
    by the database clock, so gateways with skewed clocks agree; a JWT's by its `exp`."""
    if is_stored_token(token):
        return await store.token_expires_in(hash_token(token))
    issuers = _ISSUERS.get(store)
    if issuers is None:
        return 0.0
    verified = await issuers.verify(token)
    return verified.expires_at + issuers.leeway - time.time()
