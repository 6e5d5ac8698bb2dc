"""Agent definition: a model, instructions, tools and a lifecycle."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.lifecycle import AgentLifecycle
from runtime.mcp.config import MCPHttp, MCPStdio
from runtime.providers.model_api import Model
from runtime.tools import Tool


@dataclass
class Agent:
    model: Model
    instructions: str = ""
    tools: Sequence[Tool] = ()
    lifecycle: Any = field(default_factory=AgentLifecycle)
    max_steps: int = 8
    name: str = "agent"
    # MCP servers whose tools join every step's tools as `server__tool` (runtime/mcp/).
    mcp_servers: Sequence[MCPStdio | MCPHttp] = ()

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)


def load_agent(spec: str) -> Agent:
    """Load `module:attribute`; the attribute is an Agent or a zero-argument factory of one."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"agent spec {spec!r} must look like 'module:attribute'")
    obj = getattr(importlib.import_module(module_name), attr)
    agent = obj if isinstance(obj, Agent) else obj()
    if not isinstance(agent, Agent):
        raise TypeError(f"{spec} is not an Agent")
    return agent
