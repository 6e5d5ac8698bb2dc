"""An agent for end-to-end MCP tests: `delete <id>` calls the MCP tool tests__delete_record
(from the deployment's THREADLINE_MCP_SERVERS), then answers with its result."""

from __future__ import annotations

import re
from collections.abc import Iterator

from runtime import (
    Agent,
    FunctionModel,
    MessageRole,
    ModelDelta,
    ModelRequest,
    ToolCallPart,
    message_text,
    text_response,
    tool_call_response,
)


def plan(request: ModelRequest) -> Iterator[ModelDelta]:
    last = request.messages[-1]
    if last.role is MessageRole.USER:
        found = re.search(r"delete (\w+)", message_text(last.parts))
        if found:
            yield from tool_call_response("tests__delete_record", {"record_id": found.group(1)})
            return
        yield from text_response("say: delete <id>")
        return
    results = [p.error or p.output for p in last.parts if isinstance(p, ToolCallPart)]
    yield from text_response(f"tool said: {results}")


def agent() -> Agent:
    return Agent(model=FunctionModel(plan, name="mcp-test"), name="mcp-test")
