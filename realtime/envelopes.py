"""What travels on thread channels: typed envelopes, serialised once into the client frame."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

# What a hub tells its listeners a message is, so outboxes never re-parse per connection.
MessageKind: TypeAlias = Literal["chunk", "invalidate", "resync"]


class _Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ChunkEnvelope(_Envelope):
    """A live canonical chunk; its bytes are the client's `chunk` frame as is."""

    type: Literal["chunk"] = "chunk"
    thread_id: str
    run_id: str
    seq: int = Field(ge=0)
    chunk: dict[str, Any]


class InvalidateEnvelope(_Envelope):
    """Watch invalidation: the thread committed `version`; refetch if you hold an older one."""

    type: Literal["invalidate"] = "invalidate"
    thread_id: str
    version: int = Field(ge=0)


class ResyncEnvelope(_Envelope):
    """Made by the hub, never published: live messages may have been lost, refetch the snapshot."""

    type: Literal["resync"] = "resync"
    thread_id: str


class ScopeInvalidateEnvelope(_Envelope):
    """On a scope channel: a thread of the scope committed `version` (whatever changed)."""

    type: Literal["scope.invalidate"] = "scope.invalidate"
    scope: str
    thread_id: str
    version: int = Field(ge=0)


ThreadMessage: TypeAlias = Annotated[
    ChunkEnvelope | InvalidateEnvelope, Field(discriminator="type")
]

THREAD_MESSAGE_ADAPTER: TypeAdapter[ChunkEnvelope | InvalidateEnvelope] = TypeAdapter(ThreadMessage)


def encode(envelope: BaseModel) -> bytes:
    """Serialise once; the same bytes go to the bus, the replay buffer and every websocket.

    Any envelope model: users of the bus (the runtime's control signals) define their own."""
    return orjson.dumps(envelope.model_dump())


def decode_thread_message(data: bytes) -> ChunkEnvelope | InvalidateEnvelope:
    """Parse a thread-channel message; raises `pydantic.ValidationError` on anything else."""
    return THREAD_MESSAGE_ADAPTER.validate_json(data)
