"""The public API for agent authors: `from runtime import Agent, tool, compose_lifecycle, ...`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from runtime import lifecycle
from runtime.agent import Agent
from runtime.approvals import ApprovalDecision, ApprovalPolicy
from runtime.authorization import (
    AccessKind,
    Allow,
    Authorization,
    Deny,
    Narrow,
    ThreadMatch,
    ThreadResource,
)
from runtime.compose import HistoryRewrittenErrors, as_lifecycle, compose_lifecycle
from runtime.demo.redact import RedactEmails
from runtime.domain import (
    MessageRole,
    Principal,
    Role,
    RunStatus,
    RunTrigger,
    Snapshot,
    TextPart,
    ToolCallPart,
    ToolState,
    Visibility,
    WaitKind,
)
from runtime.lifecycle import *  # noqa: F403 (its __all__ is part of the public API)
from runtime.mcp import MCPHttp, MCPStdio, ToolRule
from runtime.providers.model_api import (
    ContextMessage,
    FinishDelta,
    Model,
    ModelDelta,
    ModelRequest,
    ProviderError,
    ResponseDelta,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageDelta,
)
from runtime.providers.model_context import message_text, message_turns
from runtime.providers.scripted import (
    FunctionModel,
    ScriptedModel,
    ScriptedToolCall,
    text_response,
    tool_call_response,
    tool_calls_response,
)
from runtime.tools import (
    ALL_ROLES,
    TRUSTED_ROLES,
    ResultPayload,
    SuspendStep,
    Tool,
    ToolContext,
    ToolSource,
    denied_unless_approved,
    manual_tool,
    tool,
)
from threadline_wire.chunks import (
    RunTakeoverChunk,
    StepFinishChunk,
    StepStartChunk,
    StreamChunk,
    TextDeltaChunk,
    ToolCallChunk,
    ToolProgressChunk,
    ToolStateChunk,
)

if TYPE_CHECKING:
    from runtime.engine.publisher import Publisher
    from runtime.engine.worker import Worker
    from runtime.providers.anthropic import AnthropicModel
    from runtime.providers.openai_compat import OpenAICompatModel
    from runtime.service.thread_service import ThreadService
    from runtime.storage import PostgresStore, SqliteStore

__all__ = [
    "AccessKind",
    "Allow",
    "Authorization",
    "Deny",
    "Narrow",
    "ThreadMatch",
    "ThreadResource",
    "ALL_ROLES",
    "TRUSTED_ROLES",
    "Agent",
    "AnthropicModel",
    "ContextMessage",
    "FinishDelta",
    "FunctionModel",
    "HistoryRewrittenErrors",
    "MCPHttp",
    "MCPStdio",
    "MessageRole",
    "Model",
    "ModelDelta",
    "ModelRequest",
    "OpenAICompatModel",
    "PostgresStore",
    "Principal",
    "ProviderError",
    "ResponseDelta",
    "Publisher",
    "RedactEmails",
    "ResultPayload",
    "Role",
    "RunStatus",
    "RunTakeoverChunk",
    "RunTrigger",
    "ScriptedModel",
    "ScriptedToolCall",
    "Snapshot",
    "SqliteStore",
    "StepFinishChunk",
    "StepStartChunk",
    "StreamChunk",
    "SuspendStep",
    "ApprovalPolicy",
    "ApprovalDecision",
    "TextDelta",
    "TextDeltaChunk",
    "TextPart",
    "ThreadService",
    "Tool",
    "ToolCallChunk",
    "ToolCallDelta",
    "ToolCallPart",
    "ToolContext",
    "ToolProgressChunk",
    "ToolRule",
    "ToolSource",
    "ToolSpec",
    "ToolState",
    "ToolStateChunk",
    "UsageDelta",
    "Visibility",
    "WaitKind",
    "Worker",
    "as_lifecycle",
    "compose_lifecycle",
    "denied_unless_approved",
    "manual_tool",
    "message_text",
    "message_turns",
    "text_response",
    "tool",
    "tool_call_response",
    "tool_calls_response",
    *lifecycle.__all__,
]

# Loaded on first use: the vendor SDKs take seconds to import (`python -X importtime`), and the
# hosting classes (to run an agent in-process without the server) pull in storage and the bus.
_LAZY = {
    "AnthropicModel": "runtime.providers.anthropic",
    "OpenAICompatModel": "runtime.providers.openai_compat",
    "PostgresStore": "runtime.storage",
    "Publisher": "runtime.engine.publisher",
    "SqliteStore": "runtime.storage",
    "ThreadService": "runtime.service.thread_service",
    "Worker": "runtime.engine.worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
