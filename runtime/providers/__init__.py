"""Model providers behind one interface; the SDK-backed ones load on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime.providers.base import (
    ContextMessage,
    FinishDelta,
    Model,
    ModelDelta,
    ModelRequest,
    ProviderError,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageDelta,
)
from runtime.providers.parts import AssembledStep, AssembledToolCall, StepAssembler, Usage
from runtime.providers.scripted import (
    FunctionModel,
    ScriptedModel,
    ScriptedToolCall,
    fail_mid_stream,
    text_response,
    tool_call_response,
    tool_calls_response,
)

if TYPE_CHECKING:
    from runtime.providers.anthropic import AnthropicModel
    from runtime.providers.openai_compat import OpenAICompatModel

__all__ = [
    "AnthropicModel",
    "AssembledStep",
    "AssembledToolCall",
    "ContextMessage",
    "FinishDelta",
    "FunctionModel",
    "Model",
    "ModelDelta",
    "ModelRequest",
    "OpenAICompatModel",
    "ProviderError",
    "ScriptedModel",
    "ScriptedToolCall",
    "StepAssembler",
    "TextDelta",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
    "UsageDelta",
    "fail_mid_stream",
    "text_response",
    "tool_call_response",
    "tool_calls_response",
]

# Every runtime module imports runtime.providers.base (and so this package); the vendor SDKs
# are heavy and only needed by agents that use them.
_LAZY = {
    "OpenAICompatModel": "runtime.providers.openai_compat",
    "AnthropicModel": "runtime.providers.anthropic",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
