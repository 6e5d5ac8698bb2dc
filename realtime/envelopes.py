"""What travels on thread channels: typed envelopes, serialised once into the client frame."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple, TypeAlias

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

# The frames clients receive are declared in threadline_wire (the Python client reads the same).
from threadline_wire.frames import ChunkEnvelope, InvalidateEnvelope, ResyncEnvelope

# What a hub tells its listeners a message is, so outboxes never re-parse per connection.
MessageKind: TypeAlias = Literal["chunk", "invalidate", "resync"]


class _Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ChunkPosition(NamedTuple):
    """Where a chunk sits in its run: (episode, seq) order is the order receivers accept."""

    run_id: str
    episode: int
    seq: int

    @property
    def order(self) -> tuple[int, int]:
        return self.episode, self.seq


def chunk_position(data: bytes) -> ChunkPosition | None:
    """The position of an encoded chunk frame (None for anything that is not one)."""
    try:
        frame = orjson.loads(data)
        return ChunkPosition(str(frame["run_id"]), int(frame.get("episode", 0)), int(frame["seq"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None


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


def encode_chunk(
    thread_id: str, run_id: str, seq: int, episode: int, chunk: dict[str, Any]
) -> bytes:
    """`encode(ChunkEnvelope(...))`, byte for byte, without building the model: the runtime
    calls it once per streamed chunk. The same checks as the model's, as `ValueError`."""
    if not isinstance(thread_id, str) or not isinstance(run_id, str):
        raise ValueError("thread_id and run_id must be strings")
    if type(seq) is not int or type(episode) is not int or seq < 0 or episode < 0:
        raise ValueError("seq and episode must be integers >= 0")
    if not isinstance(chunk, dict):
        raise ValueError("chunk must be a dict")
    return orjson.dumps(
        {
            "type": "chunk",
            "thread_id": thread_id,
            "run_id": run_id,
            "seq": seq,
            "episode": episode,
            "chunk": chunk,
        }
    )


def _check_version(thread_id: str, version: int) -> int:
    if not isinstance(thread_id, str):
        raise ValueError("thread_id must be a string")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ValueError("version must be an integer >= 0")
    return int(version)


def encode_invalidate(thread_id: str, version: int) -> bytes:
    """`encode(InvalidateEnvelope(...))`, byte for byte, without building the model (one per
    commit). The same checks as the model's, as `ValueError`."""
    version = _check_version(thread_id, version)
    return orjson.dumps({"type": "invalidate", "thread_id": thread_id, "version": version})


def encode_scope_invalidate(scope: str, thread_id: str, version: int) -> bytes:
    """`encode(ScopeInvalidateEnvelope(...))`, byte for byte, without building the model."""
    version = _check_version(thread_id, version)
    if not isinstance(scope, str):
        raise ValueError("scope must be a string")
    return orjson.dumps(
        {"type": "scope.invalidate", "scope": scope, "thread_id": thread_id, "version": version}
    )


def decode_thread_message(data: bytes) -> ChunkEnvelope | InvalidateEnvelope:
    """Parse a thread-channel message; raises `pydantic.ValidationError` on anything else."""
    return THREAD_MESSAGE_ADAPTER.validate_json(data)


__all__ = [
    "THREAD_MESSAGE_ADAPTER",
    "ChunkEnvelope",
    "ChunkPosition",
    "InvalidateEnvelope",
    "MessageKind",
    "ResyncEnvelope",
    "ScopeInvalidateEnvelope",
    "ThreadMessage",
    "chunk_position",
    "decode_thread_message",
    "encode",
    "encode_chunk",
    "encode_invalidate",
    "encode_scope_invalidate",
]
