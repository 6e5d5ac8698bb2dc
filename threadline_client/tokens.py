"""The client's bearer token: fixed, or fresh ones from a provider before the current expires."""

from __future__ import annotations

import asyncio
import base64
import binascii
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

log = logging.getLogger(__name__)

# A callable that returns a bearer token (a `tl_` token or a JWT), sync or async: called for
# the first token and again, shortly before each one expires.
TokenProvider = Callable[[], str | Awaitable[str]]

# How long before a token's expiry a fresh one is fetched: this many seconds, but at most a
# quarter of the time it has left, so a short-lived token is still used for most of its life.
REFRESH_MARGIN = 30.0


def jwt_expiry(token: str) -> float | None:
    """A JWT's `exp` (epoch seconds), read without verifying it (the server verifies); None for
    a `tl_` token or anything that is not a JWT with a numeric `exp`."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1]
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def refresh_delay(expires_in: float, margin: float = REFRESH_MARGIN) -> float:
    """Seconds to wait before fetching the next token for one that expires in `expires_in`."""
    return max(0.0, expires_in - min(margin, expires_in / 4))


class TokenSource:
    """The current token, and a provider to ask for the next (None: the token is fixed).

    Concurrent callers of `fresh()` share one call of the provider.
    """

    def __init__(
        self,
        token: str | None,
        provider: TokenProvider | None,
        *,
        margin: float = REFRESH_MARGIN,
    ) -> None:
        if token is None and provider is None:
            raise ValueError("give a token or a token_provider")
        self.current = token or ""
        self.since = time.time()  # when the current token arrived
        self.provider = provider
        self.margin = margin
        self._fetching: asyncio.Future[str] | None = None

    @property
    def refreshable(self) -> bool:
        return self.provider is not None

    async def get(self) -> str:
        """A token worth sending now: the current one, or the provider's next when the current
        is missing or (a JWT) due for refresh."""
        if not self.current or (self.provider is not None and self.due()):
            return await self.fresh()
        return self.current

    def due(self) -> bool:
        """The current token is a JWT within its refresh margin (a `tl_` token's expiry is
        only known to the server: websockets ask it, HTTP refreshes on `token_expired`)."""
        exp = jwt_expiry(self.current)
        if exp is None:
            return False
        return time.time() >= self.since + refresh_delay(exp - self.since, self.margin)

    async def fresh(self) -> str:
        """The provider's next token (it becomes the current one); the current without one."""
        if self.provider is None:
            return self.current
        if self._fetching is not None:
            return await asyncio.shield(self._fetching)
        self._fetching = asyncio.get_running_loop().create_future()
        try:
            value = self.provider()
            token = await value if inspect.isawaitable(value) else value
            if not isinstance(token, str) or not token:
                raise TypeError("the token provider must return a non-empty string")
            self.current, self.since = token, time.time()
            self._fetching.set_result(token)
            return token
        except BaseException as exc:
            self._fetching.set_exception(exc)
            self._fetching.exception()  # retrieved: a failure nobody else awaited is no warning
            raise
        finally:
            self._fetching = None


async def keep_fresh(
    token: str,
    refresh: Callable[[str], Awaitable[dict[str, Any] | None]],
    next_token: Callable[[], Awaitable[str]],
    tokens: TokenSource,
) -> None:
    """Keep one websocket on a valid token for as long as it is open (docs/protocol.md, "Token
    refresh"): a little before `token` expires, send `next_token()` with `refresh` (the ack, or
    None if refused), and so on. A `tl_` token's expiry is the server's to tell: refreshing to
    the same token asks it."""
    exp = jwt_expiry(token)
    expires_in: Any = None if exp is None else exp - time.time()
    if expires_in is None:
        answer = await refresh(token)
        expires_in = None if answer is None else answer.get("expires_in")
    while isinstance(expires_in, int | float):
        deadline = time.time() + expires_in
        await asyncio.sleep(refresh_delay(expires_in, tokens.margin))
        answer = None
        # The provider may fail or hand out a refused token: try again until the deadline.
        while answer is None and time.time() < deadline:
            try:
                answer = await refresh(await next_token())
            except Exception as exc:
                log.warning("the token provider failed: %s", exc)
            if answer is None:
                await asyncio.sleep(min(1.0, max(0.05, (deadline - time.time()) / 4)))
        if answer is None:
            return  # the socket closes at the expiry; the watch reconnects with a new token
        expires_in = answer.get("expires_in")
