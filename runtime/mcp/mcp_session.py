"""One live MCP session per server, kept by a task that (re)connects it with backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx2
import mcp.types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from runtime.mcp.config import MCPHttp, MCPStdio, SecretUnavailable, http_headers, stdio_env

log = logging.getLogger(__name__)

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]

# JSON-RPC's reserved range for implementation errors: the SDK reports a closed connection and
# its own timeouts with codes in it; codes outside it are the server's answer to the call.
_TRANSPORT_CODES = range(-32099, -31999)
# A call that timed out is followed by a ping this short: no answer means the server hangs.
_PING_TIMEOUT = 3.0
_FIRST_BACKOFF = 0.1


_TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    httpx2.HTTPError,
    OSError,
    SecretUnavailable,
)


class MCPUnavailable(Exception):
    """The server could not be reached in time (down, restarting, misconfigured)."""


class MCPCallFailed(Exception):
    """A tools/call ended without a result: timeout, lost connection, or a protocol error."""


_LIST_ERRORS: tuple[type[Exception], ...] = (
    MCPUnavailable,
    MCPCallFailed,
    MCPError,
    TimeoutError,
    *_TRANSPORT_ERRORS,
)


class MCPConnection:
    """The session with one server. A background task connects it, waits until it breaks (a
    call found the transport gone, or a ping after a timeout went unanswered) and connects
    again with a doubling pause; callers wait for it up to `connect_timeout`. The SDK's
    context managers are entered and left in that one task, as anyio requires.

    `generation` moves on every (re)connection and every `notifications/tools/list_changed`:
    the tool list fetched at an older generation is stale."""

    def __init__(self, server: MCPStdio | MCPHttp) -> None:
        self.server = server
        self.generation = 0
        self.connects = 0
        self.last_error: str | None = None
        self._session: ClientSession | None = None
        self._ready = asyncio.Event()
        self._broken = asyncio.Event()
        self._closing = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._listed: tuple[int, list[types.Tool]] | None = None
        # One HTTP client for the connection's life: its connection pool outlives reconnects.
        self._http: httpx2.AsyncClient | None = None

    @property
    def name(self) -> str:
        return self.server.name

    def start(self) -> None:
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name=f"mcp-{self.name}")

    async def aclose(self) -> None:
        self._closing.set()
        self._broken.set()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._runner
            self._runner = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # --- the connecting task -------------------------------------------------------------

    async def _run(self) -> None:
        delay = _FIRST_BACKOFF
        while not self._closing.is_set():
            try:
                async with self._open() as session:
                    self.connects += 1
                    self.generation += 1
                    self.last_error = None
                    self._session = session
                    self._broken.clear()
                    self._ready.set()
                    delay = _FIRST_BACKOFF
                    await self._broken.wait()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.last_error = _describe(exc)
                log.warning("mcp server %s: %s", self.name, self.last_error)
            finally:
                self._ready.clear()
                self._session = None
            if self._closing.is_set():
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.server.max_backoff)

    @contextlib.asynccontextmanager
    async def _open(self) -> AsyncIterator[ClientSession]:
        async with contextlib.AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(self._transport())
            session = ClientSession(read, write, message_handler=self._on_message)
            await stack.enter_async_context(session)
            async with asyncio.timeout(self.server.connect_timeout):
                await session.initialize()
            yield session

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        server = self.server
        if isinstance(server, MCPStdio):
            params = StdioServerParameters(
                command=server.command, args=server.args, env=stdio_env(server), cwd=server.cwd
            )
            return stdio_client(params, errlog=sys.stderr)
        if self._http is None:
            self._http = create_mcp_http_client()
        # Read at every connection, so a rotated secret is picked up by the next reconnect.
        self._http.headers.update(http_headers(server))
        return streamable_http_client(server.url, http_client=self._http)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.generation += 1
        elif isinstance(message, Exception):
            log.debug("mcp server %s: transport: %s", self.name, message)

    def _mark_broken(self, session: ClientSession) -> None:
        if self._session is session:
            # At once, not when the runner wakes: the next call must wait for the new session.
            self._ready.clear()
            self._session = None
            self._broken.set()

    async def _connected(self) -> ClientSession:
        self.start()
        try:
            async with asyncio.timeout(self.server.connect_timeout):
                while True:
                    await self._ready.wait()
                    if self._session is not None:
                        return self._session
                    await asyncio.sleep(0)
        except TimeoutError:
            reason = f": {self.last_error}" if self.last_error else ""
            raise MCPUnavailable(f"MCP server {self.name} is unavailable{reason}") from None

    # --- what tools use -------------------------------------------------------------------------

    async def list_tools(self) -> tuple[int, list[types.Tool]]:
        """The server's tools and the generation they were listed at; cached until the
        generation moves. A server that cannot be reached keeps its last list, so calls to
        it reach the model as errors instead of the tools vanishing mid-conversation."""
        if self._listed is not None and self._listed[0] == self.generation:
            return self._listed
        try:
            session = await self._connected()
            generation = self.generation
            tools: list[types.Tool] = []
            cursor: str | None = None
            while True:
                params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                async with asyncio.timeout(self.server.call_timeout):
                    page = await session.list_tools(params=params)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
        except _LIST_ERRORS as exc:
            if self._listed is None:
                raise MCPUnavailable(f"MCP server {self.name}: {_describe(exc)}") from None
            log.warning("mcp server %s: listing tools failed (%s)", self.name, _describe(exc))
            return self._listed
        self._listed = (generation, tools)
        return self._listed

    async def call(
        self, name: str, arguments: dict[str, Any], report: ProgressFn | None = None
    ) -> types.CallToolResult:
        """tools/call. A cancelled caller (a stop) and a timeout both send MCP cancellation
        (the SDK's courtesy `notifications/cancelled`); failures raise MCPCallFailed or
        MCPUnavailable, never anything the worker would die of."""
        session = await self._connected()
        timeout = self.server.call_timeout

        # The SDK's callback protocol names its parameters.
        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            if report is not None:
                await report(progress, total, message)

        try:
            async with asyncio.timeout(timeout):
                result = await session.call_tool(name, arguments, progress_callback=on_progress)
        except TimeoutError:
            await self._check_alive(session)
            raise MCPCallFailed(f"{name} timed out after {timeout:g}s (cancelled)") from None
        except MCPError as exc:
            if exc.code in _TRANSPORT_CODES:
                self._mark_broken(session)
                raise MCPCallFailed(f"connection to {self.name} lost: {exc.message}") from None
            raise MCPCallFailed(f"{self.name} refused the call: {exc.message}") from None
        except _TRANSPORT_ERRORS as exc:
            self._mark_broken(session)
            raise MCPCallFailed(f"connection to {self.name} lost: {_describe(exc)}") from None
        return result

    async def _check_alive(self, session: ClientSession) -> None:
        try:
            async with asyncio.timeout(_PING_TIMEOUT):
                await session.send_ping()
        except Exception:
            log.warning("mcp server %s: no answer to a ping after a timeout", self.name)
            self._mark_broken(session)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
