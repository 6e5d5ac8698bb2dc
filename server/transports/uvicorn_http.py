"""uvicorn's h11 HTTP protocol with a header-read deadline and the connection limit on upgrades.

uvicorn bounds an idle keep-alive connection (`timeout_keep_alive`) and answers 503 to a
request beyond `limit_concurrency`, but a connection that sends nothing, or a request line and
headers a byte at a time, is held forever: uvicorn arms no timer before the first request, and
every byte received cancels the keep-alive timer. This protocol arms one more timer whenever it
waits for a request's headers (the connection opened, or the previous response completed) and
closes the connection if they are not complete `header_timeout` seconds later, however slowly
they trickle in. And uvicorn checks the limit for plain requests only: a websocket upgrade
beyond it gets the same 503 here instead of one more open socket.

docs/operations.md, "Connections and timeouts", gives the settings and the reverse-proxy advice.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.transports.corked import CorkedTransport

log = logging.getLogger(__name__)

# Descriptors kept back from the connection limit for what else a process opens: its
# Postgres pool, Redis connections, the SQLite files, logs and the listening socket.
RESERVED_DESCRIPTORS = 128

_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 19\r\n"
    b"connection: close\r\n\r\n"
    b"Service Unavailable"
)


def connection_limit(wanted: int) -> int:
    """`wanted`, lowered to what the process's descriptor limit (RLIMIT_NOFILE) can hold."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft - RESERVED_DESCRIPTORS >= wanted:
        return wanted
    allowed = max(1, soft - RESERVED_DESCRIPTORS)
    log.warning(
        "THREADLINE_MAX_CONNECTIONS=%d is above what the descriptor limit (ulimit -n %d) holds: "
        "using %d",
        wanted,
        soft,
        allowed,
    )
    return allowed


def http_protocol(header_timeout: float) -> type[BoundedH11Protocol]:
    """The protocol class for uvicorn's `http=` with this header-read deadline (seconds)."""

    class HttpProtocol(BoundedH11Protocol):
        pass

    HttpProtocol.header_timeout = header_timeout
    return HttpProtocol


class BoundedH11Protocol(H11Protocol):
    """H11Protocol plus a header-read deadline and the connection limit on upgrades."""

    header_timeout = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # A response's head and body in one write; a websocket upgraded from this connection
        # is handed the same transport, so its frames of one loop step are one write too.
        super().connection_made(CorkedTransport(transport, self.loop))
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_received()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        # h11 leaves IDLE once a request's line and headers are complete (it is then the app's
        # turn); anything else means they are still being waited for.
        if self.conn.their_state is not h11.IDLE:
            self._headers_received()

    def on_response_complete(self) -> None:
        # Armed before uvicorn starts the next cycle: a pipelined request already buffered is
        # parsed in there, and disarms it again at once.
        self._await_headers()
        super().on_response_complete()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._headers_received()
        limit = self.limit_concurrency
        if limit is not None and len(self.connections) >= limit:
            # The same count as uvicorn's for a plain request (this connection is among them).
            self.logger.warning("Exceeded concurrency limit.")
            self.transport.write(_UNAVAILABLE)
            self.transport.close()
            return
        super().handle_websocket_upgrade(event)

    def _await_headers(self) -> None:
        self._headers_received()
        if self.transport is not None and not self.transport.is_closing():
            self._header_deadline = self.loop.call_later(self.header_timeout, self._header_timeout)

    def _headers_received(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_timeout(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            log.debug(
                "closing a connection whose request headers took over %ss", self.header_timeout
            )
            # Nothing of ours is buffered for it: close() lets go at once.
            self.transport.close()
