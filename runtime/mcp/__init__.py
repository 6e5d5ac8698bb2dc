"""Tools from MCP servers: declare servers (`MCPStdio`, `MCPHttp`) on an Agent or in Settings."""

from __future__ import annotations

from runtime.mcp.config import MCPHttp, MCPServer, MCPServersAdapter, MCPStdio, ToolRule

__all__ = ["MCPHttp", "MCPServer", "MCPServersAdapter", "MCPStdio", "ToolRule"]
