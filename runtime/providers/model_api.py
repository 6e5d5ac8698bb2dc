"""Provider interface: one request shape in, one normalised stream of model deltas out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from runtime.domain import MessageRole, Part


class _Delta(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextDelta(_Delta):
    type: Literal["text"] = "text"
    text: str


class ToolCallDelta(_Delta):
    """A fragment of one tool call. `index` identifies the call within the response; `id` and
    `name` arrive on the first fragment (providers may repeat them); `arguments` is a fragment
    of the JSON-encoded input."""

    type: Literal["tool-call"] = "tool-call"
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class UsageDelta(_Delta):
    type: Literal["usage"] = "usage"
    input_tokens: int = 0
    output_tokens: int = 0


class FinishDelta(_Delta):
    type: Literal["finish"] = "finish"
    reason: str  # "stop", "tool_calls", "length", "content_filter", ...


class ResponseDelta(_Delta):
    """Which response this is, as the provider names it (traces: `gen_ai.response.*`). Sent
    once per response, when the provider says; it changes nothing the step produces."""

    type: Literal["response"] = "response"
    id: str | None = None
    model: str | None = None


ModelDelta = Annotated[
    TextDelta | ToolCallDelta | UsageDelta | FinishDelta | ResponseDelta,
    Field(discriminator="type"),
]
ModelDeltaAdapter: TypeAdapter[ModelDelta] = TypeAdapter(ModelDelta)


class ContextMessage(_Delta):
    """One message of model context. Tool results travel inside tool-call parts (`output` /
    `error` with a final state); providers split them into their wire format's tool messages."""

    role: MessageRole
    parts: tuple[Part, ...]


class ToolSpec(_Delta):
    name: str
    description: str = ""
    parameters: dict[str, Any]  # JSON Schema of the input


class ModelRequest(_Delta):
    instructions: str = ""
    messages: tuple[ContextMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    settings: dict[str, Any] = Field(default_factory=dict)


class ProviderError(Exception):
    """A provider failed (setup or mid-stream). `retryable` when a retry may succeed."""

    def __init__(self, message: str, *, retryable: bool = False, status: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class Model(Protocol):
    """A model provider. `stream` yields normalised deltas; errors raise ProviderError.

    Traces also read, when a provider has them, `provider` (`gen_ai.provider.name`), `model`
    (the model id the provider knows) and `base_url` (`server.address`)."""

    name: str

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]: ...
