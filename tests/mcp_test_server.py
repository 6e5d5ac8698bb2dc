"""An MCP server of the tests' own (the SDK's MCPServer, once FastMCP): a destructive tool, a
read-only one, a slow one reporting progress, one that crashes the server, one that changes
the tool list. Every call is a JSON line in $MCP_TEST_LOG, so tests count what ran.

    python tests/mcp_test_server.py http PORT     (Streamable HTTP on 127.0.0.1:PORT/mcp)
    python tests/mcp_test_server.py stdio
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("threadline-test")
LOG = Path(os.environ.get("MCP_TEST_LOG", "mcp-test.log"))


def record(event: str, **fields: object) -> None:
    with LOG.open("a") as out:
        out.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


@server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
async def delete_record(record_id: str) -> str:
    """Delete a record (destructive: Threadline asks for approval first)."""
    record("delete_record", record_id=record_id)
    # A test may hold the answer after the effect, to kill the worker before it commits.
    hold = os.environ.get("MCP_TEST_HOLD")
    if hold:
        for _ in range(600):
            if not await asyncio.to_thread(os.path.exists, hold):
                break
            await asyncio.sleep(0.05)
    return f"deleted {record_id}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def lookup(key: str) -> dict[str, str]:
    """Look a key up (read-only: runs at once)."""
    record("lookup", key=key)
    return {"key": key, "value": key.upper()}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def slow_count(steps: int, ctx: Context) -> str:
    """Count slowly, reporting progress at every step."""
    record("slow_count.start", steps=steps)
    try:
        for step in range(steps):
            await ctx.report_progress(step + 1, steps, f"step {step + 1} of {steps}")
            await asyncio.sleep(0.1)
    except asyncio.CancelledError:
        record("slow_count.cancelled")
        raise
    record("slow_count.done")
    return f"counted to {steps}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def crash() -> str:
    """Crash the server process."""
    record("crash")
    os._exit(3)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def add_tool(ctx: Context) -> str:
    """Add the tool `echo` and tell the client the list changed."""

    def echo(text: str) -> str:
        """Echo the text."""
        return text

    server.add_tool(echo, name="echo", annotations=ToolAnnotations(read_only_hint=True))
    await ctx.session.send_tool_list_changed()
    return "added echo"


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
