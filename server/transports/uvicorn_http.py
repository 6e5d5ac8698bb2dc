"""uvicorn's HTTP protocol (httptools) with a header-read deadline, a bound on a request's head
and the connection limit on upgrades.

uvicorn bounds an idle keep-alive connection (`timeout_keep_alive`) and answers 503 to a
request beyond `limit_concurrency`, but a connection that sends nothing, or a request line and
headers a byte at a time, is held forever: uvicorn arms no timer before the first request, and
every byte received cancels the keep-alive timer. This protocol arms one more timer whenever it
waits for a request's headers (the connection opened, or the previous response completed with
no pipelined request already parsed) and closes the connection if they are not complete
`header_timeout` seconds later, however slowly they trickle in; likewise a request's body must
be complete `body_timeout` seconds after its headers. uvicorn's httptools parser
bounds nothing of a request's head either: here a request line and headers of more than
`MAX_HEAD_BYTES` get `431` and the connection closes (h11's own bound, which applied until
2026-12-04, when this protocol parsed with h11: docs/benchmarks.md, tenth pass). And uvicorn
checks the limit for plain requests only: a websocket upgrade beyond it gets the same 503 here
instead of one more open socket.

docs/operations.md, "Connections and timeouts", gives the settings and the reverse-proxy advice.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from server.transports.corked import CorkedTransport

log = logging.getLogger(__name__)

# Descriptors kept back from the connection limit for what else a process opens: its
# Postgres pool, Redis connections, the SQLite files, logs and the listening socket.
RESERVED_DESCRIPTORS = 128

# A request line and headers beyond this (name and value bytes) get 431: h11's default bound.
MAX_HEAD_BYTES = 16 * 1024

_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 31\r\n"
    b"connection: close\r\n\r\n"
    b"Request Header Fields Too Large"
)

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


def http_protocol(header_timeout: float, body_timeout: float) -> type[BoundedHttpProtocol]:
    """The protocol class for uvicorn's `http=` with these deadlines (seconds): a request's
    headers, and its body once the headers are complete."""

    class HttpProtocol(BoundedHttpProtocol):
        pass

    HttpProtocol.header_timeout = header_timeout
    HttpProtocol.body_timeout = body_timeout
    return HttpProtocol


class BoundedHttpProtocol(HttpToolsProtocol):
    """HttpToolsProtocol plus a header-read deadline, a bound on the request's head and the
    connection limit on upgrades."""

    # Set by `http_protocol` from the settings (THREADLINE_HTTP_HEADER_TIMEOUT, _BODY_TIMEOUT).
    header_timeout: float
    body_timeout: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._body_deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # A response's head and body in one write; a websocket upgraded from this connection
        # is handed the same transport, so its frames of one loop step are one write too.
        super().connection_made(CorkedTransport(transport, self.loop))
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_received()
        self._body_received()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        self._head_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._headers_received()
        super().on_headers_complete()
        # Disarmed when the message is complete: at once for a request without a body.
        self._body_deadline = self.loop.call_later(self.body_timeout, self._body_timeout)

    def on_message_complete(self) -> None:
        self._body_received()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        # A pipelined request already parsed has its headers (uvicorn starts it in there);
        # otherwise the next request's are waited for.
        waiting = not self.pipeline
        super().on_response_complete()
        if waiting:
            self._await_headers()

    def send_400_response(self, msg: str) -> None:
        if self._head_bytes > MAX_HEAD_BYTES:  # the parser stopped at `_count_head`'s raise
            self.logger.warning("Request head over %d bytes.", MAX_HEAD_BYTES)
            self.transport.write(_TOO_LARGE)
            self.transport.close()
            return
        super().send_400_response(msg)

    def handle_websocket_upgrade(self) -> None:
        self._headers_received()
        self._body_received()
        limit = self.limit_concurrency
        if limit is not None and len(self.connections) >= limit:
            # The same count as uvicorn's for a plain request (this connection is among them).
            self.logger.warning("Exceeded concurrency limit.")
            self.transport.write(_UNAVAILABLE)
            self.transport.close()
            return
        super().handle_websocket_upgrade()

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            # Raised inside a parser callback: the parser stops and uvicorn answers its 400,
            # which `send_400_response` turns into the 431 it is.
            raise ValueError("request head too large")

    def _await_headers(self) -> None:
        self._headers_received()
        if self.transport is not None and not self.transport.is_closing():
            self._header_deadline = self.loop.call_later(self.header_timeout, self._header_timeout)

    def _headers_received(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _body_received(self) -> None:
        if self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None

    def _body_timeout(self) -> None:
        self._body_deadline = None
        if not self.transport.is_closing():
            log.debug("closing a connection whose request body took over %ss", self.body_timeout)
            # The route reading the body sees the client gone (`bad_request`, never a 5xx).
            self.transport.close()

    def _header_timeout(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            log.debug(
                "closing a connection whose request headers took over %ss", self.header_timeout
            )
            # Nothing of ours is buffered for it: close() lets go at once.
            self.transport.close()
