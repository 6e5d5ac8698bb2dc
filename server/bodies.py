"""Request bodies of the HTTP API (and the fields websocket command frames share with them)."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from runtime.errors import InvalidInput, TooLarge
from runtime.models import (
    MAX_METADATA_BYTES,
    MAX_TEXT_CHARS,
    MAX_TITLE_CHARS,
    InputPolicy,
    Visibility,
)

ID_MAX = 200


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClientToolBody(Body):
    """A tool the browser executes; the model may call it, the client posts its result."""

    name: str = Field(min_length=1, max_length=ID_MAX)
    description: str = ""
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


class CreateThreadBody(Body):
    title: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Required only for tokens with several scopes.
    scope: str | None = Field(default=None, min_length=1, max_length=ID_MAX)

    def check_limits(self) -> None:
        if len(self.title) > MAX_TITLE_CHARS:
            raise TooLarge(f"title is longer than {MAX_TITLE_CHARS} characters")
        try:
            size = len(orjson.dumps(self.metadata))
        except TypeError as exc:  # nested deeper than orjson's limit (254)
            raise InvalidInput(f"metadata is not JSON-serialisable: {exc}") from exc
        if size > MAX_METADATA_BYTES:
            raise TooLarge(f"metadata is larger than {MAX_METADATA_BYTES} bytes")


class SendMessageBody(Body):
    text: str = Field(min_length=1)
    client_request_id: str | None = Field(default=None, min_length=1, max_length=ID_MAX)
    policy: InputPolicy = InputPolicy.ENQUEUE
    client_tools: list[ClientToolBody] = Field(default_factory=list, max_length=64)

    def check_limits(self) -> None:
        if len(self.text) > MAX_TEXT_CHARS:
            raise TooLarge(f"text is longer than {MAX_TEXT_CHARS} characters")


class ResumeBody(Body):
    payload: dict[str, Any]
    expected_version: int | None = Field(default=None, ge=0)


class ToolResultBody(Body):
    """Result of a client-tool or manual-result action: the tool's output, or an error."""

    output: Any = None
    error: str | None = None
    expected_version: int | None = Field(default=None, ge=0)

    def payload(self) -> dict[str, Any]:
        return {"output": self.output, "error": self.error}


class RegenerateBody(Body):
    message_id: str | None = Field(default=None, min_length=1, max_length=ID_MAX)


class VisibilityBody(Body):
    visibility: Visibility


class EmptyBody(Body):
    pass
