"""The LangGraph twin of bench/scripted_agent.py's `api_agent`, served by Aegra (it runs in
build/aegra-venv, not in the project's virtualenv: see bench/aegra.py).

A scripted chat model streams, as Threadline's does: to the user's message, one tool call
(`lookup`, arguments `{"key": "answer"}`); after the tool's answer, `BENCH_TOKENS` (15) text
tokens `token{i} ` back to back. The graph is the usual ReAct loop: a model node, a `ToolNode`,
`tools_condition` between them. No network model.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

TOOL_CALL = {"name": "lookup", "args": {"key": "answer"}, "id": "call_1"}


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look a key up (a constant answer: the bench measures the server, not the tool)."""
    return {"key": key, "value": "forty-two"}


def _tokens() -> int:
    return int(os.environ.get("BENCH_TOKENS", "15"))


class ScriptedChatModel(BaseChatModel):
    """A tool call to a user's message, then the tokens (the same sizes as Threadline's)."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _chunks(self, messages: Sequence[BaseMessage]) -> Iterator[AIMessageChunk]:
        if isinstance(messages[-1], HumanMessage):
            yield AIMessageChunk(
                content="",
                tool_call_chunks=[
                    {"name": "lookup", "args": '{"key": "answer"}', "id": "call_1", "index": 0}
                ],
            )
            return
        for i in range(_tokens()):
            yield AIMessageChunk(content=f"token{i} ")

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if isinstance(messages[-1], HumanMessage):
            message = AIMessage(content="", tool_calls=[TOOL_CALL])
        else:
            message = AIMessage(content="".join(f"token{i} " for i in range(_tokens())))
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        # BaseChatModel reports each chunk to the callbacks (LangGraph's "messages" stream).
        for chunk in self._chunks(messages):
            yield ChatGenerationChunk(message=chunk)


model = ScriptedChatModel()


async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
    return {"messages": [await model.ainvoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("agent", call_model)
builder.add_node("tools", ToolNode([lookup]))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")
graph = builder.compile()
