"""Input models of the commands: one per command, shared by its HTTP route and websocket frame."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from runtime.domain import (
    MAX_METADATA_BYTES,
    MAX_TEXT_CHARS,
    MAX_TITLE_CHARS,
    InputPolicy,
    Visibility,
)
from runtime.errors import InvalidInput, TooLarge

ID_MAX = 200
ThreadId = Annotated[str, Field(min_length=1, max_length=ID_MAX)]
ItemId = Annotated[str, Field(min_length=1, max_length=ID_MAX)]


class Input(BaseModel):
    """A command's whole input: the ids it addresses and its arguments.

    Over HTTP the ids come from the path and the rest from the body (or the query); over the
    websocket everything is in the frame, next to the envelope fields `type` and `id`.
    Unknown fields are refused so that typos surface instead of being ignored.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    def check(self) -> None:
        """Limits beyond what the field types say, raised as domain errors (none by default)."""


class ClientToolInput(BaseModel):
    """A tool the browser executes; the model may call it, the client posts its result."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=ID_MAX)
    description: str = ""
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


class NoInput(Input):
    pass


class ThreadRef(Input):
    thread_id: ThreadId


class CreateThread(Input):
    title: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Required only for tokens with several scopes.
    scope: str | None = Field(default=None, min_length=1, max_length=ID_MAX)

    def check(self) -> None:
        if len(self.title) > MAX_TITLE_CHARS:
            raise TooLarge(f"title is longer than {MAX_TITLE_CHARS} characters")
        try:
            size = len(orjson.dumps(self.metadata))
        except TypeError as exc:  # nested deeper than orjson's limit (254)
            raise InvalidInput(f"metadata is not JSON-serialisable: {exc}") from exc
        if size > MAX_METADATA_BYTES:
            raise TooLarge(f"metadata is larger than {MAX_METADATA_BYTES} bytes")


class ListThreads(Input):
    limit: int = Field(default=100, ge=1, le=500)


class GetSnapshot(Input):
    thread_id: ThreadId
    include_hidden: bool = False
    # Older messages: the snapshot's `page.before` cursor (a message position).
    before: int | None = Field(default=None, ge=0)
    limit: int | None = Field(default=None, ge=1, le=500)


class SendMessage(Input):
    thread_id: ThreadId
    text: str = Field(min_length=1)
    client_request_id: str | None = Field(default=None, min_length=1, max_length=ID_MAX)
    policy: InputPolicy = InputPolicy.ENQUEUE
    client_tools: list[ClientToolInput] = Field(default_factory=list, max_length=64)

    def check(self) -> None:
        # The same error storage raises, so both transports answer alike before any lookup.
        if len(self.text) > MAX_TEXT_CHARS:
            raise TooLarge(
                f"text is longer than {MAX_TEXT_CHARS} characters", limit=MAX_TEXT_CHARS
            )


class CancelQueued(Input):
    thread_id: ThreadId
    item_id: ItemId


class RevokeToken(Input):
    token: str = Field(min_length=1, max_length=256)


class GetQueued(Input):
    thread_id: ThreadId
    item_id: ItemId


class ResumeAction(Input):
    thread_id: ThreadId
    action_id: ItemId
    payload: dict[str, Any]
    expected_version: int | None = Field(default=None, ge=0)


class ToolResult(Input):
    """Result of a client-tool or manual-result action: the tool's output, or an error."""

    thread_id: ThreadId
    action_id: ItemId
    output: Any = None
    error: str | None = None
    expected_version: int | None = Field(default=None, ge=0)

    def payload(self) -> dict[str, Any]:
        return {"output": self.output, "error": self.error}


class StopRun(Input):
    thread_id: ThreadId
    run_id: ItemId


class Regenerate(Input):
    thread_id: ThreadId
    message_id: ItemId | None = None


class SetVisibility(Input):
    thread_id: ThreadId
    message_id: ItemId
    visibility: Visibility
