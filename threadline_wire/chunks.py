"""Stream chunks of a step: what transform_step_stream yields and every client receives."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Chunk(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextDeltaChunk(_Chunk):
    type: Literal["text-delta"] = "text-delta"
    delta: str


class ToolCallChunk(_Chunk):
    """A complete tool call from the model (input assembled from its deltas)."""

    type: Literal["tool-call"] = "tool-call"
    tool_call_id: str
    name: str
    input: dict[str, Any]


class ToolStateChunk(_Chunk):
    """A tool part changed state (running, output-available, awaiting-action, ...)."""

    type: Literal["tool-state"] = "tool-state"
    tool_call_id: str
    state: str
    output: Any = None
    error: str | None = None


class ToolProgressChunk(_Chunk):
    """A running tool reported progress (an MCP progress notification, `ctx.report_progress`).
    Live only: the tool part's final state is what a snapshot shows."""

    type: Literal["tool-progress"] = "tool-progress"
    tool_call_id: str
    progress: float
    total: float | None = None
    message: str | None = None


class StepStartChunk(_Chunk):
    type: Literal["step-start"] = "step-start"
    step: int


class StepFinishChunk(_Chunk):
    type: Literal["step-finish"] = "step-finish"
    step: int
    finish_reason: str | None = None


class RunTakeoverChunk(_Chunk):
    """Published when another worker took the run over after its lease expired."""

    type: Literal["run-takeover"] = "run-takeover"
    episode: int


StreamChunk = Annotated[
    TextDeltaChunk
    | ToolCallChunk
    | ToolStateChunk
    | ToolProgressChunk
    | StepStartChunk
    | StepFinishChunk
    | RunTakeoverChunk,
    Field(discriminator="type"),
]
StreamChunkAdapter: TypeAdapter[StreamChunk] = TypeAdapter(StreamChunk)
