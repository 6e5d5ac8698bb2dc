"""Bearer tokens: `tl_` tokens (minted here, stored as a sha256 hash) and issuers' JWTs."""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
import weakref
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from runtime.domain import Principal, Role
from runtime.storage.store import TokenStore
from runtime.storage.token_admin import LAST_USED_RESOLUTION
from server.auth_cache import KEY_CHARS, PrincipalCache
from server.auth_errors import TokenMismatch
from server.auth_errors import Unauthorized as Unauthorized
from server.oidc import Issuers

log = logging.getLogger(__name__)

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
    groups: Collection[str] = (),
) -> str:
    """Mint a token for `subject` (valid `expires_in` seconds, or until revoked; shown to others
    as `display_name`, else the subject; in `groups`, which approval policies route by); the
    plain token is returned once and never stored."""
    if not scopes:
        raise ValueError("a token needs at least one scope")
    token = new_token()
    await store.create_token(
        hash_token(token), subject, role, frozenset(scopes), expires_in, display_name, groups
    )
    return token


def token_key(token: str) -> str:
    """A short key naming a token in quota counters and revocations; not enough to look the
    token up (a prefix of its hash)."""
    return token_key_of_hash(hash_token(token))


def token_key_of_hash(token_hash: str) -> str:
    return token_hash[:KEY_CHARS]


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


# Each store's principal cache, where the app enabled one (`cache_principals`): only gateways,
# which also hear the revocation broadcasts that make an entry forgotten.
_PRINCIPALS: weakref.WeakKeyDictionary[TokenStore, PrincipalCache] = weakref.WeakKeyDictionary()


def cache_principals(store: TokenStore, cache: PrincipalCache | None) -> None:
    """Serve `store`'s `tl_` tokens from `cache` (None: read the store on every request)."""
    if cache is None:
        _PRINCIPALS.pop(store, None)
    else:
        _PRINCIPALS[store] = cache


def forget_principal(store: TokenStore, token_key: str) -> None:
    """A token was revoked: the next request with it reads the store (and is refused)."""
    cache = _PRINCIPALS.get(store)
    if cache is not None:
        cache.forget(token_key)


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
    token_hash = hash_token(token)
    cache = _PRINCIPALS.get(store)
    principal = None if cache is None else cache.get(token_hash)
    if principal is None:
        if cache is None:
            principal = await store.principal_for_token(token_hash)
        else:
            ticket = cache.ticket()
            granted = await store.token_grant(token_hash)
            if granted is not None:
                principal = granted[0]
                cache.put(token_hash, principal, granted[1], ticket)
    if principal is None:
        raise Unauthorized("the token is invalid")
    await _mark_used(store, token_hash)
    return principal


# When this process last recorded each token's use: the store is asked at most once per
# LAST_USED_RESOLUTION per token and process, so a busy token costs no query per request.
_MARKED: dict[str, float] = {}
_MARKED_MAX = 10_000


async def _mark_used(store: TokenStore, token_hash: str) -> None:
    now = time.monotonic()
    if now - _MARKED.get(token_hash, float("-inf")) < LAST_USED_RESOLUTION:
        return
    if len(_MARKED) >= _MARKED_MAX:
        _MARKED.clear()  # forgetting costs one extra conditional update per token, no more
    _MARKED[token_hash] = now
    touch = getattr(store, "touch_token", None)
    if touch is not None:
        try:
            await touch(token_hash)
        except Exception as exc:  # a last-use mark never fails a request
            log.warning("could not record a token's use: %s", exc)


@dataclass(frozen=True)
class Grant:
    """What one authenticated token grants, and for how long: what a websocket holds, from its
    connect token to each `auth.refresh` (docs/protocol.md, "Token refresh")."""

    principal: Principal
    token_hash: str
    issuer: str  # "" for a `tl_` token (stored, revocable there), else the JWT's issuer
    expires_in: float | None  # seconds left when checked; None: never expires

    @property
    def stored(self) -> bool:
        return not self.issuer

    def check_successor(self, fresh: Grant) -> None:
        """`TokenMismatch` unless `fresh` names the same holder: same issuer (or both `tl_`),
        subject, role and scopes. Display name and groups follow the fresher token."""
        old, new = self.principal, fresh.principal
        if fresh.issuer != self.issuer or new.subject != old.subject:
            raise TokenMismatch("the new token names another subject than the connection's")
        if new.role != old.role or new.scopes != old.scopes:
            raise TokenMismatch(
                "the new token grants another role or other scopes; reconnect to change them"
            )

    def answer(self) -> dict[str, Any]:
        expires_at = None if self.expires_in is None else time.time() + self.expires_in
        return {
            "subject": self.principal.subject,
            "expires_in": self.expires_in,
            "expires_at": expires_at,
        }


async def grant(store: TokenStore, token: str | None) -> Grant:
    """Authenticate `token` (as `authenticate`) and say until when it is valid: one path for the
    token a websocket opens with and every token it refreshes to."""
    if token and not is_stored_token(token):
        issuers = _ISSUERS.get(store)
        if issuers is None or token.count(".") != 2:
            raise Unauthorized("the token is invalid")
        verified = await issuers.verify(token)
        remaining = verified.expires_at + issuers.leeway - time.time()
        return Grant(verified.principal, hash_token(token), verified.issuer, remaining)
    principal = await authenticate(store, token)
    token_hash = hash_token(token or "")
    return Grant(principal, token_hash, "", await store.token_expires_in(token_hash))
