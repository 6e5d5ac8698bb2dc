"""Websocket close codes of the protocol, in one enum that realtime and server both use."""

from __future__ import annotations

import enum


class CloseCode(enum.IntEnum):
    """Every close code a Threadline server sends (docs/protocol.md, "Close codes").

    It lives in realtime because the outbox, which knows nothing of the server, decides the
    slow-consumer close; the gateway decides the others. 4000-4999 are free for applications:
    4401 echoes HTTP 401, 4408 HTTP 408 (timeout) and 4429 HTTP 429 (too many requests).
    """

    NORMAL = 1000
    GOING_AWAY = 1001
    TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    UNAUTHORIZED = 4401
    SLOW_CONSUMER = 4408
    # The connection's token was revoked or expired while it was open (echoes HTTP 403).
    TOKEN_REVOKED = 4403
    # The token or subject already holds its maximum of open websockets.
    TOO_MANY_CONNECTIONS = 4429
