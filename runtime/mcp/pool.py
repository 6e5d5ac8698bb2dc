"""The MCP servers of one worker process: one session each, their tools as one tool source."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from types import TracebackType

import mcp.types as types

from runtime.mcp.config import MCPHttp, MCPStdio
from runtime.mcp.mcp_session import MCPConnection, MCPUnavailable
from runtime.mcp.mcp_tools import MCPTool, build_tools

log = logging.getLogger(__name__)


class MCPPool:
    """Started with the worker and closed in its shutdown: a stdio server is one child
    process for all the worker's runs (not one per call), an HTTP server one session over
    one connection pool. `tools()` is the step's MCP tools, rebuilt only when a server's
    generation moved (reconnect, `notifications/tools/list_changed`)."""

    def __init__(self, servers: Sequence[MCPStdio | MCPHttp], reserved: Sequence[str] = ()):
        names = [s.name for s in servers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"MCP server names must be unique: {', '.join(duplicates)}")
        self.connections = {s.name: MCPConnection(s) for s in servers}
        # Names of the agent's own tools: an MCP tool never shadows one.
        self._reserved = frozenset(reserved)
        self._built: tuple[tuple[int, ...], tuple[MCPTool, ...]] | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> MCPPool:
        self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def start(self) -> None:
        for connection in self.connections.values():
            connection.start()

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.connections.values()))

    async def tools(self) -> tuple[MCPTool, ...]:
        """Every reachable server's tools (a server never reached contributes none; the
        others still serve the step)."""
        async with self._lock:  # concurrent episodes list once
            listed = await asyncio.gather(*(self._list(c) for c in self.connections.values()))
            key = tuple(generation for generation, _ in listed)
            if self._built is not None and self._built[0] == key:
                return self._built[1]
            taken = set(self._reserved)
            tools: list[MCPTool] = []
            for connection, (_, remote) in zip(self.connections.values(), listed, strict=True):
                tools.extend(build_tools(connection, remote, taken))
            self._built = (key, tuple(tools))
            return self._built[1]

    async def _list(self, connection: MCPConnection) -> tuple[int, list[types.Tool]]:
        try:
            return await connection.list_tools()
        except MCPUnavailable as exc:
            log.warning("%s; its tools are left out of this step", exc)
            return -1, []
