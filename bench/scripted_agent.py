"""The benches' served agents (`THREADLINE_AGENT=scripted_agent:api_agent`, with bench/ on the
server's PYTHONPATH): a scripted model that calls one tool, then streams its answer.

- `api_agent`: a tool call (`lookup`), then `BENCH_TOKENS` (15) text tokens back to back: the
  run bench/api.py drives through the public API.
- `paced_agent`: no tool; `BENCH_TOKENS` (20) tokens, `BENCH_TOKEN_INTERVAL_MS` (50) apart: a
  model that mostly waits, as real ones do (bench/live_runs.py). Every token carries
  `t=<time.monotonic_ns() when yielded>`, so a client measures model -> tab latency on the one
  system-wide clock.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

from pydantic import BaseModel, ConfigDict

from runtime.agent import Agent
from runtime.domain import MessageRole
from runtime.providers.model_api import (
    FinishDelta,
    ModelDelta,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
)
from runtime.providers.scripted import FunctionModel
from runtime.tools import tool


class LookupInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str


@tool(idempotent=True)
async def lookup(args: LookupInput) -> dict[str, str]:
    """Look a key up (a constant answer: the bench measures the server, not the tool)."""
    return {"key": args.key, "value": "forty-two"}


def _tokens(default: int) -> int:
    return int(os.environ.get("BENCH_TOKENS", default))


async def _tool_then_tokens(request: ModelRequest) -> AsyncIterator[ModelDelta]:
    last = next((m for m in reversed(request.messages) if m.role is not MessageRole.SYSTEM), None)
    if last is not None and last.role is MessageRole.USER:
        yield ToolCallDelta(index=0, id="call_1", name="lookup", arguments='{"key": "answer"}')
        yield FinishDelta(reason="tool_calls")
        return
    for i in range(_tokens(15)):
        yield TextDelta(text=f"token{i} ")
    yield FinishDelta(reason="stop")


async def _paced_tokens(request: ModelRequest) -> AsyncIterator[ModelDelta]:
    interval = float(os.environ.get("BENCH_TOKEN_INTERVAL_MS", "50")) / 1000
    for i in range(_tokens(20)):
        if i:
            await asyncio.sleep(interval)
        # The stamp ends the chunk's text, so bench/wsclient.py reads it up to the closing quote.
        yield TextDelta(text=f"n{i} t={time.monotonic_ns()}")
    yield FinishDelta(reason="stop")


def api_agent() -> Agent:
    return Agent(model=FunctionModel(_tool_then_tokens), tools=[lookup], name="bench-api")


def paced_agent() -> Agent:
    return Agent(model=FunctionModel(_paced_tokens), name="bench-paced")
