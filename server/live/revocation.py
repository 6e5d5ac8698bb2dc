"""Token revocation reaching open websockets: a bus message every gateway acts on at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import orjson

from realtime.bus import Bus
from runtime.domain import Principal, Role
from runtime.errors import Forbidden, NotFound
from runtime.storage.token_admin import TokenAdminStore, TokenInfo

log = logging.getLogger(__name__)

# The bus channel of revocations (the bus backend adds its own prefix).
TOKENS_CHANNEL = "tokens"


def revocation_message(token_key: str) -> bytes:
    return orjson.dumps({"type": "token-revoked", "token_key": token_key})


async def publish_revoked(bus: Bus, token_key: str) -> bool:
    """Tell every gateway to close the token's websockets; False if the bus refused it (the
    gateways' periodic token check still closes them, within THREADLINE_TOKEN_RECHECK)."""
    try:
        await bus.publish(TOKENS_CHANNEL, revocation_message(token_key))
    except Exception as exc:
        log.warning("could not publish a token revocation: %s", exc)
        return False
    return True


class TokenRevoker:
    """Revokes tokens in storage, then tells every gateway (the admin route and the CLI)."""

    def __init__(self, store: TokenAdminStore, bus: Bus | None) -> None:
        self.store = store
        self.bus = bus

    async def revoke(self, principal: Principal, token: str) -> dict[str, object]:
        """Revoke `token` as `principal` (an admin of every scope the token holds)."""
        from server.auth import hash_token  # auth imports the store layer

        if principal.role is not Role.ADMIN:
            raise Forbidden(f"role {principal.role} may not revoke tokens; admin required")
        token_hash = hash_token(token)
        target = await self.store.principal_for_token(token_hash)
        # A token outside the admin's scopes is as unknown as a missing one.
        if target is None or not target.scopes <= principal.scopes:
            raise NotFound("no such active token")
        return await self._revoke(token_hash, target)

    async def list(self, principal: Principal) -> list[TokenInfo]:
        """The active tokens an admin may see: those whose scopes are all the admin's."""
        _require_admin(principal)
        tokens = await self.store.list_tokens()
        return [token for token in tokens if set(token.scopes) <= principal.scopes]

    async def revoke_id(self, principal: Principal, token_id: str) -> dict[str, object]:
        """Revoke the token `token_id` names (an id of `list`), as `revoke` does."""
        _require_admin(principal)
        token_hash = await self.store.token_hash_of_id(token_id)
        target = None if token_hash is None else await self.store.principal_for_token(token_hash)
        if token_hash is None or target is None or not target.scopes <= principal.scopes:
            raise NotFound("no such active token")
        return await self._revoke(token_hash, target)

    async def _revoke(self, token_hash: str, target: Principal) -> dict[str, object]:
        from server.auth import forget_principal, token_key_of_hash

        await self.store.revoke_token(token_hash)
        key = token_key_of_hash(token_hash)
        # Refused from the next request on here; the broadcast does it on the other gateways.
        forget_principal(self.store, key)
        published = self.bus is not None and await publish_revoked(self.bus, key)
        return {"revoked": True, "subject": target.subject, "published": published}


def _require_admin(principal: Principal) -> None:
    if principal.role is not Role.ADMIN:
        raise Forbidden(f"role {principal.role} may not administer tokens; admin required")


async def listen_revocations(bus: Bus, on_revoked: Callable[[str], Awaitable[object]]) -> None:
    """Run until cancelled: call `on_revoked(token_key)` for each revocation on the bus."""
    while True:
        try:
            async with bus.subscribe(TOKENS_CHANNEL) as subscription:
                async for data in subscription:
                    with contextlib.suppress(orjson.JSONDecodeError, KeyError, TypeError):
                        message = orjson.loads(data)
                        if message.get("type") == "token-revoked":
                            await on_revoked(str(message["token_key"]))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The bus reconnects by itself; resubscribe after a pause.
            log.warning("token revocation listener restarts: %s", exc)
            await asyncio.sleep(1.0)


__all__ = [
    "TOKENS_CHANNEL",
    "TokenRevoker",
    "listen_revocations",
    "publish_revoked",
    "revocation_message",
]
