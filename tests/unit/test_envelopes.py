"""Bus envelopes (realtime thread frames, runtime control signals): exact bytes, strict validation,
channel names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from realtime.channels import (
    gateway_key,
    hash_tag,
    presence_key,
    replay_key,
    scope_channel,
    thread_channel,
)
from realtime.envelopes import (
    ChunkEnvelope,
    ChunkPosition,
    InvalidateEnvelope,
    ResyncEnvelope,
    ScopeInvalidateEnvelope,
    chunk_position,
    decode_thread_message,
    encode,
    encode_chunk,
    encode_invalidate,
    encode_scope_invalidate,
)
from runtime.engine.control import (
    CONTROL_CHANNEL,
    StopEnvelope,
    WakeupEnvelope,
    decode_control,
    encode_stop,
    encode_wakeup,
)


def test_chunk_bytes_are_the_protocol_frame() -> None:
    envelope = ChunkEnvelope(
        thread_id="th_1", run_id="run_1", seq=0, chunk={"type": "text-delta", "delta": "Hé"}
    )
    data = encode(envelope)
    assert isinstance(data, bytes)
    assert data == (
        b'{"type":"chunk","thread_id":"th_1","run_id":"run_1","seq":0,"episode":0,'
        b'"chunk":{"type":"text-delta","delta":"H\xc3\xa9"}}'
    )
    assert list(orjson.loads(data)) == ["type", "thread_id", "run_id", "seq", "episode", "chunk"]
    assert chunk_position(data) == ChunkPosition("run_1", 0, 0)
    assert chunk_position(b'{"type":"invalidate","thread_id":"th_1","version":1}') is None
    assert chunk_position(b"[1") is None


def test_invalidate_bytes_are_the_protocol_frame() -> None:
    data = encode(InvalidateEnvelope(thread_id="th_1", version=12))
    assert data == b'{"type":"invalidate","thread_id":"th_1","version":12}'


def test_thread_messages_round_trip() -> None:
    chunk = ChunkEnvelope(
        thread_id="t", run_id="r", seq=3, chunk={"type": "tool-call", "input": {"a": [1, 2]}}
    )
    invalidate = InvalidateEnvelope(thread_id="t", version=1)
    assert decode_thread_message(encode(chunk)) == chunk
    assert decode_thread_message(encode(invalidate)) == invalidate


def test_control_messages_round_trip() -> None:
    assert decode_control(encode(WakeupEnvelope())) == WakeupEnvelope(run_id=None)
    assert encode(WakeupEnvelope()) == b'{"type":"wakeup","run_id":null,"thread_id":null}'
    assert decode_control(encode(WakeupEnvelope(run_id="r"))).run_id == "r"
    named = WakeupEnvelope(run_id="r", thread_id="t")
    assert decode_control(encode(named)) == named
    # A wakeup of an earlier version (no thread_id) is still a wakeup.
    assert decode_control(b'{"type":"wakeup","run_id":"r"}') == WakeupEnvelope(run_id="r")


def test_control_decoding_ignores_fields_a_newer_sender_adds() -> None:
    """Workers and gateways of two versions share the control channel during a rolling
    upgrade: a field this version does not know is ignored, the signal still taken."""
    assert decode_control(b'{"type":"wakeup","run_id":"r","why":"x"}') == WakeupEnvelope(run_id="r")
    assert decode_control(b'{"type":"stop","run_id":"r","by":"x"}') == StopEnvelope(run_id="r")
    assert decode_control(encode(StopEnvelope(run_id="r"))) == StopEnvelope(run_id="r")


def test_resync_notice_shape() -> None:
    assert orjson.loads(encode(ResyncEnvelope(thread_id="t"))) == {
        "type": "resync",
        "thread_id": "t",
    }


@pytest.mark.parametrize(
    "data",
    [
        b'{"type":"chunk","thread_id":"t","run_id":"r","seq":0}',  # no chunk
        b'{"type":"chunk","thread_id":"t","run_id":"r","seq":-1,"chunk":{}}',
        b'{"type":"invalidate","thread_id":"t","version":1,"extra":true}',
        b'{"type":"wakeup"}',  # a control message on a thread channel
        b'{"type":"nope"}',
        b"not json",
    ],
)
def test_thread_decoding_is_strict(data: bytes) -> None:
    with pytest.raises(ValidationError):
        decode_thread_message(data)


@pytest.mark.parametrize(
    "data",
    [
        b'{"type":"stop"}',
        b'{"type":"invalidate","thread_id":"t","version":1}',
        b'{"type":"wakeup","run_id":5}',
        b'{"type":"wakeup","run_id":"r","thread_id":["t"]}',
        b'{"type":"nope","run_id":"r"}',
    ],
)
def test_control_decoding_is_strict(data: bytes) -> None:
    with pytest.raises(ValidationError):
        decode_control(data)


def test_envelopes_are_frozen() -> None:
    envelope = InvalidateEnvelope(thread_id="t", version=1)
    with pytest.raises(ValidationError):
        envelope.version = 2  # type: ignore[misc]  # mypy refuses it too: the point here


def test_channel_names() -> None:
    assert thread_channel("th_1") == "thread:{th_1}"
    assert replay_key("th_1") == "replay:{th_1}"
    assert presence_key("th_1") == "presence-gw:{th_1}"
    assert gateway_key("gw1") == "presence-alive:gw1"
    assert scope_channel("s") == "scope:{s}"
    assert CONTROL_CHANNEL == "control"
    assert thread_channel("a") != thread_channel("b")
    with pytest.raises(ValueError):
        thread_channel("")


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "text-delta", "delta": 'héllo \u2028 "quoted"'},
        {"type": "tool-call", "tool_call_id": "c1", "name": "n", "input": {"a": [1, 2.5, None]}},
        {},
    ],
)
def test_encode_chunk_is_the_envelope_encoding(chunk: dict[str, object]) -> None:
    envelope = ChunkEnvelope(thread_id="t1", run_id="r1", seq=7, episode=3, chunk=chunk)
    assert encode_chunk("t1", "r1", 7, 3, dict(chunk)) == encode(envelope)
    assert decode_thread_message(encode_chunk("t1", "r1", 7, 3, dict(chunk))) == envelope


@pytest.mark.parametrize(
    "args",
    [
        ("t", "r", -1, 0, {}),
        ("t", "r", 0, -1, {}),
        ("t", "r", True, 0, {}),
        ("t", None, 0, 0, {}),
        ("t", "r", 0, 0, ["not", "a", "dict"]),
    ],
)
def test_encode_chunk_refuses_what_the_envelope_refuses(args: tuple[object, ...]) -> None:
    with pytest.raises(ValueError):
        encode_chunk(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize("thread_id", ["th_1", 'ünï "q"'])
@pytest.mark.parametrize("version", [0, 7, 2**40])
def test_direct_encoders_are_the_envelope_encodings(thread_id: str, version: int) -> None:
    invalidate = InvalidateEnvelope(thread_id=thread_id, version=version)
    assert encode_invalidate(thread_id, version) == encode(invalidate)
    scoped = ScopeInvalidateEnvelope(scope="acme", thread_id=thread_id, version=version)
    assert encode_scope_invalidate("acme", thread_id, version) == encode(scoped)
    assert encode_wakeup() == encode(WakeupEnvelope())
    assert encode_wakeup(thread_id) == encode(WakeupEnvelope(run_id=thread_id))
    assert encode_wakeup("run_1", thread_id) == encode(
        WakeupEnvelope(run_id="run_1", thread_id=thread_id)
    )
    traced = WakeupEnvelope(run_id="run_1", thread_id=thread_id, traceparent="00-ab-cd-01")
    assert encode_wakeup("run_1", thread_id, "00-ab-cd-01") == encode(traced)
    assert decode_control(encode(traced)) == traced
    assert encode_stop(thread_id) == encode(StopEnvelope(run_id=thread_id))
    assert decode_control(encode_stop(thread_id)) == StopEnvelope(run_id=thread_id)


@pytest.mark.parametrize(
    ("encoder", "args"),
    [
        (encode_invalidate, ("t", -1)),
        (encode_invalidate, ("t", True)),
        (encode_invalidate, (None, 1)),
        (encode_scope_invalidate, (None, "t", 1)),
        (encode_scope_invalidate, ("s", "t", -1)),
        (encode_wakeup, (3,)),
        (encode_wakeup, ("r", 3)),
        (encode_stop, (None,)),
    ],
)
def test_direct_encoders_refuse_what_the_envelopes_refuse(
    encoder: Callable[..., bytes], args: tuple[Any, ...]
) -> None:
    # Called untyped on purpose: what a caller without a type checker could pass.
    with pytest.raises(ValueError):
        encoder(*args)


def test_hash_tags_keep_a_thread_on_one_slot() -> None:
    from redis.crc import key_slot

    for thread_id in ("th_1", "a}b", "{x}", "ünï"):
        names = [thread_channel(thread_id), replay_key(thread_id), presence_key(thread_id)]
        slots = {key_slot(("threadline:" + name).encode()) for name in names}
        assert len(slots) == 1, (thread_id, names)
    # Values Redis could not use as a tag get a digest, still one per value.
    assert hash_tag("") != hash_tag("}") and hash_tag("a}b") != hash_tag("a}c")
    assert hash_tag("a}b").count("}") == 1 and hash_tag("ok") == "{ok}"
