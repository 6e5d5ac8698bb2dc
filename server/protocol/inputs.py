"""Input models of the commands: one per command, shared by its HTTP route and websocket frame."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from runtime.domain import (
    MAX_METADATA_BYTES,
    MAX_TEXT_CHARS,
    MAX_TITLE_CHARS,
    InputPolicy,
    Visibility,
)
from runtime.errors import InvalidInput, TooLarge
from runtime.storage.thread_query import ThreadQuery, ThreadStatus
from threadline_wire import frames

# The wire's id bound (threadline_wire.frames), which every id of an input shares.
ID_MAX = frames.ID_MAX
ThreadId = Annotated[str, Field(min_length=1, max_length=ID_MAX)]
ItemId = Annotated[str, Field(min_length=1, max_length=ID_MAX)]


class Input(BaseModel):
    """A command's whole input: the ids it addresses and its arguments.

    Over HTTP the ids come from the path and the rest from the body (or the query); over the
    websocket everything is in the frame, next to the envelope fields `type` and `id`.
    Unknown fields are refused so that typos surface instead of being ignored.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        """Every field of every command, on both transports: what storage and the encoder
        accept, refused here as `invalid_input` naming the field, before anything changes."""
        problem = unstorable(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    def check(self) -> None:
        """Limits beyond what the field types say, raised as domain errors (none by default)."""


# JSON nested deeper than this is refused: the encoder stops at 255 levels, and no real
# payload, result or metadata needs more than a few dozen.
MAX_JSON_DEPTH = 64


def unstorable(value: Any, path: str = "", depth: int = 0) -> str | None:
    """Why `value` cannot be stored, or None: a NUL character in a string (Postgres TEXT cannot
    hold one) or nesting deeper than MAX_JSON_DEPTH. `path` locates it inside the field."""
    where = f" at {path}" if path else ""
    if isinstance(value, str):
        return f"contains a NUL character{where}" if "\x00" in value else None
    if isinstance(value, dict | list | tuple):
        if depth >= MAX_JSON_DEPTH:
            return f"nested deeper than {MAX_JSON_DEPTH} levels{where}"
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and "\x00" in key:
                return f"contains a NUL character in a key{where}"
            problem = unstorable(item, f"{path}.{key}" if path else str(key), depth + 1)
            if problem is not None:
                return problem
    elif isinstance(value, BaseModel):
        return unstorable(value.model_dump(), path, depth)
    return None


class ClientToolInput(BaseModel):
    """A tool the browser executes; the model may call it, the client posts its result."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=ID_MAX)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class NoInput(Input):
    pass


# A thread id a client chose (AG-UI `threadId`, AI SDK chat `id`): no dot, which stored ids of
# client threads use to add their scope's digest (runtime/service/client_threads.py).
ClientThreadId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,100}$")]


class OpenThread(Input):
    """A thread by the id a client chose, inside the caller's scope; created on first use when
    `create` (a foreign id is a free one: the caller's own thread of that id)."""

    thread_id: ClientThreadId
    create: bool = True


class ThreadRef(Input):
    thread_id: ThreadId


class SubscribeThread(ThreadRef):
    # True: this connection's invalidations of the thread carry the snapshot delta (additive;
    # docs/protocol.md, "Snapshot deltas"); a client that cannot apply one leaves it out.
    deltas: bool = False


class CreateThread(Input):
    title: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Required only for tokens with several scopes.
    scope: str | None = Field(default=None, min_length=1, max_length=ID_MAX)

    def check(self) -> None:
        _check_title(self.title)
        _check_metadata(self.metadata)


class RenameThread(Input):
    thread_id: ThreadId
    title: str

    def check(self) -> None:
        _check_title(self.title)


def _check_title(title: str) -> None:
    if len(title) > MAX_TITLE_CHARS:
        raise TooLarge(f"title is longer than {MAX_TITLE_CHARS} characters")


class UpdateMetadata(Input):
    """`PATCH /v1/threads/{thread_id}/metadata`: `metadata` is a JSON merge patch (RFC 7396)
    of the public metadata: keys set, `null` removes a key, nested objects merge."""

    thread_id: ThreadId
    metadata: dict[str, Any]

    def check(self) -> None:
        _check_metadata(self.metadata)


def _check_metadata(metadata: dict[str, Any]) -> None:
    try:
        size = len(orjson.dumps(metadata))
    except TypeError as exc:  # nested deeper than orjson's limit (254)
        raise InvalidInput(f"metadata is not JSON-serialisable: {exc}") from exc
    if size > MAX_METADATA_BYTES:
        raise TooLarge(f"metadata is larger than {MAX_METADATA_BYTES} bytes")


MetadataKey = Annotated[str, Field(min_length=1, max_length=ID_MAX)]


class ListThreads(Input):
    """`GET /v1/threads`: a page of the caller's threads, newest update first. Query:
    `metadata.<key>=<value>` (each must match a string value), `status` (idle, running,
    waiting), `updated_after`/`updated_before` (epoch seconds), `cursor` (the previous page's
    `next_cursor`, opaque), `limit`."""

    limit: int = Field(default=100, ge=1, le=500)
    metadata: dict[MetadataKey, Annotated[str, Field(max_length=MAX_TITLE_CHARS)]] = Field(
        default_factory=dict, max_length=16
    )
    # A Literal, not the enum: the OpenAPI document inlines query parameters' schemas.
    status: Literal["idle", "running", "waiting"] | None = None
    updated_after: float | None = Field(default=None, allow_inf_nan=False)
    updated_before: float | None = Field(default=None, allow_inf_nan=False)
    cursor: str | None = Field(default=None, min_length=1, max_length=4 * ID_MAX)

    def query(self) -> ThreadQuery:
        return ThreadQuery(
            metadata=self.metadata,
            status=None if self.status is None else ThreadStatus(self.status),
            updated_after=self.updated_after,
            updated_before=self.updated_before,
            after=self.cursor,
        )


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
            raise TooLarge(f"text is longer than {MAX_TEXT_CHARS} characters", limit=MAX_TEXT_CHARS)


class CancelQueued(Input):
    thread_id: ThreadId
    item_id: ItemId


class RevokeToken(Input):
    token: str = Field(min_length=1, max_length=256)


class RefreshToken(Input):
    # The fresher bearer token (a `tl_` token or an issuer's JWT, which MAX_JWT_CHARS bounds).
    token: str = Field(min_length=1, max_length=16 * 1024)


class RevokeTokenById(Input):
    # A token's public id (`threadline token list`): hex digits of its hash.
    token_id: str = Field(pattern=r"^[0-9a-f]{24}$")


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
    expected_version: int | None = Field(default=None, ge=0)


class RetryRun(Input):
    thread_id: ThreadId
    run_id: ItemId
    expected_version: int | None = Field(default=None, ge=0)


class SetVisibility(Input):
    thread_id: ThreadId
    message_id: ItemId
    visibility: Visibility
    expected_version: int | None = Field(default=None, ge=0)


class ListActions(Input):
    """`GET /v1/actions`: a page of the scope-wide inbox; `cursor` is the previous page's
    `next_cursor` (opaque)."""

    status: Literal["pending"] = "pending"
    limit: int = Field(default=100, ge=1, le=500)
    cursor: str | None = Field(default=None, min_length=1, max_length=ID_MAX)
    # "me": only the actions the caller may decide now (docs/protocol.md, "Action inbox").
    assigned: Literal["me"] | None = None


class ScopeRef(Input):
    """A scope of the token's (none: all of them)."""

    scope: str | None = Field(default=None, min_length=1, max_length=ID_MAX)


class InboxSubscribe(ScopeRef):
    """`actions.subscribe`: a scope of the token's (none: all), and `assigned: "me"` for only
    the actions the caller may decide now."""

    assigned: Literal["me"] | None = None


class PresenceUpdate(Input):
    """What this connection is doing in a subscribed thread; a field left out stays as it was
    (`"reviewing": null` clears it)."""

    thread_id: ThreadId
    typing: bool | None = None
    reviewing: str | None = Field(default=None, min_length=1, max_length=ID_MAX)

    def changes(self) -> dict[str, Any]:
        return {
            name: getattr(self, name)
            for name in ("typing", "reviewing")
            if name in self.model_fields_set
        }
