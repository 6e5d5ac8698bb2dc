"""Websocket frame models: decoding, validation errors and id echo rules."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
import pytest
from pydantic import BaseModel

from realtime.envelopes import ResyncEnvelope, encode
from runtime.domain import InputPolicy, Visibility
from server.protocol.client_frames import (
    CLIENT_FRAME_TYPES,
    FRAME_MODELS,
    ClientFrameAdapter,
    FrameError,
    decode_frame,
)
from server.protocol.inputs import NoInput, ResumeAction, SendMessage, SetVisibility, ThreadRef
from server.protocol.wire_errors import wire_error
from threadline_wire.frames import Ack, Subscribed

M = TypeVar("M", bound=BaseModel)
VALID: dict[str, dict[str, Any]] = {
    "thread.rename": {"thread_id": "t1", "title": "new"},
    "thread.update_metadata": {"thread_id": "t1", "metadata": {"owner": "alice"}},
    "subscribe": {"thread_id": "t1"},
    "unsubscribe": {"thread_id": "t1"},
    "message.send": {"thread_id": "t1", "text": "hi"},
    "action.resume": {"thread_id": "t1", "action_id": "a1", "payload": {"approved": True}},
    "action.client_result": {"thread_id": "t1", "action_id": "a1", "output": [1]},
    "action.manual_result": {"thread_id": "t1", "action_id": "a1", "output": "x"},
    "run.stop": {"thread_id": "t1", "run_id": "r1"},
    "regenerate": {"thread_id": "t1"},
    "run.retry": {"thread_id": "t1", "run_id": "r1"},
    "message.visibility": {"thread_id": "t1", "message_id": "m1", "visibility": "hidden"},
    "queue.cancel": {"thread_id": "t1", "item_id": "q1"},
    "ping": {},
    "actions.subscribe": {},  # every field optional: all the token's scopes
    "actions.unsubscribe": {},
    "presence.update": {"thread_id": "t1", "typing": True},
    "auth.refresh": {"token": "tl_fresh"},
    "schedule.create": {"thread_id": "t1", "cron": "0 9 * * *", "text": "digest"},
    "schedule.pause": {"schedule_id": "s1"},
    "schedule.resume": {"schedule_id": "s1"},
    "schedule.delete": {"schedule_id": "s1"},
    "webhook.update": {"webhook_id": "w1", "enabled": False},
    "webhook.delete": {"webhook_id": "w1"},
    "delivery.redeliver": {"delivery_id": "d1"},
    "action.reassign": {"thread_id": "t1", "action_id": "a1", "to_subject": "bob"},
}


def valid_frame(kind: str) -> bytes:
    return orjson.dumps({"type": kind, **VALID[kind]})


def fail(raw: str | bytes) -> FrameError:
    with pytest.raises(FrameError) as info:
        decode_frame(raw)
    return info.value


def field_errors(raw: str | bytes) -> list[Any]:
    """The field errors of a frame that fails validation."""
    errors = fail(raw).errors
    assert errors is not None
    return errors


def as_input(frame: BaseModel, model: type[M]) -> M:
    """The decoded frame as its command's input model. Frame classes subclass both `Frame` and
    the input at run time (built from the command table); no static type says so."""
    assert isinstance(frame, model), type(frame)
    return frame


def test_every_type_has_a_valid_example() -> None:
    assert set(VALID) == set(CLIENT_FRAME_TYPES)


@pytest.mark.parametrize("kind", CLIENT_FRAME_TYPES)
def test_decodes_every_type_from_text_and_bytes(kind: str) -> None:
    data = {"type": kind, "id": "x1", **VALID[kind]}
    for raw in (orjson.dumps(data), orjson.dumps(data).decode()):
        frame = decode_frame(raw)
        assert frame.type == kind
        assert frame.id == "x1"


@pytest.mark.parametrize("kind", [k for k in CLIENT_FRAME_TYPES if VALID[k]])
def test_missing_fields_are_invalid_input_with_id(kind: str) -> None:
    error = fail(orjson.dumps({"type": kind, "id": 9}))
    assert error.code == "invalid_input"
    assert error.frame_id == 9
    assert error.errors and all(set(e) == {"loc", "msg"} for e in error.errors)


def test_defaults_and_typed_fields() -> None:
    frame = decode_frame(b'{"type": "message.send", "thread_id": "t", "text": "hi"}')
    send = as_input(frame, SendMessage)
    assert send.policy is InputPolicy.ENQUEUE and send.client_tools == []
    assert frame.id is None
    vis = decode_frame(valid_frame("message.visibility"))
    assert as_input(vis, SetVisibility).visibility is Visibility.HIDDEN
    resume = decode_frame(valid_frame("action.resume"))
    assert as_input(resume, ResumeAction).payload == {"approved": True}


def test_not_json() -> None:
    error = fail(b"{nope")
    assert error.code == "invalid_json" and error.frame_id is None


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"ping"', b"3", b"null"])
def test_not_an_object(raw: bytes) -> None:
    assert fail(raw).code == "invalid_frame"


def test_missing_or_non_string_type_keeps_id() -> None:
    error = fail(b'{"id": "a"}')
    assert (error.code, error.frame_id) == ("invalid_frame", "a")
    assert fail(b'{"type": 5, "id": 1}').code == "invalid_frame"


def test_unknown_type_keeps_id() -> None:
    error = fail(b'{"type": "launch.rockets", "id": 42}')
    assert (error.code, error.frame_id) == ("unknown_type", 42)


def test_extra_fields_are_refused() -> None:
    error = fail(b'{"type": "ping", "id": 1, "extra": true}')
    assert error.code == "invalid_input"
    assert error.errors == [{"loc": ["extra"], "msg": "Extra inputs are not permitted"}]


def test_unusable_ids_are_not_echoed() -> None:
    assert fail(b'{"type": "nope", "id": {"a": 1}}').frame_id is None
    assert fail(b'{"type": "nope", "id": true}').frame_id is None
    assert fail(orjson.dumps({"type": "nope", "id": "x" * 500})).frame_id is None


def test_invalid_enum_and_types() -> None:
    bad_policy = {"type": "message.send", "thread_id": "t", "text": "x", "policy": "later"}
    assert field_errors(orjson.dumps(bad_policy))[0]["loc"] == ["policy"]
    bad_payload = {"type": "action.resume", "thread_id": "t", "action_id": "a", "payload": []}
    assert field_errors(orjson.dumps(bad_payload))[0]["loc"] == ["payload"]
    empty_text = {"type": "message.send", "thread_id": "t", "text": ""}
    assert fail(orjson.dumps(empty_text)).code == "invalid_input"


def test_adapter_is_the_discriminated_union() -> None:
    ping = ClientFrameAdapter.validate_python({"type": "ping"})
    assert isinstance(ping, FRAME_MODELS["ping"])
    as_input(ping, NoInput)  # asserts it is one
    subscribe = ClientFrameAdapter.validate_json(b'{"type": "subscribe", "thread_id": "t"}')
    assert isinstance(subscribe, FRAME_MODELS["subscribe"])
    as_input(subscribe, ThreadRef)


def test_server_frames_serialise_without_nulls() -> None:
    assert orjson.loads(Subscribed(thread_id="t", version=3).to_bytes()) == {
        "type": "subscribed",
        "thread_id": "t",
        "version": 3,
    }
    assert orjson.loads(Ack(id="m", thread_id="t", version=2, run_id="r").to_bytes()) == {
        "type": "ack",
        "id": "m",
        "thread_id": "t",
        "version": 2,
        "run_id": "r",
    }
    # `resync` reaches clients as the bus envelope itself (there is no server-side frame model).
    resync = encode(ResyncEnvelope(thread_id="t"))
    assert orjson.loads(resync) == {"type": "resync", "thread_id": "t"}
    error = wire_error(FrameError("unknown_type", "unknown frame type", 7)).frame(7)
    assert orjson.loads(error) == {
        "type": "error",
        "code": "unknown_type",
        "message": "unknown frame type",
        "id": 7,
    }


def test_a_frame_nested_deeper_than_validation_can_go_is_a_clear_error() -> None:
    from server.protocol.client_frames import FrameError, decode_frame

    depth = 1000  # orjson parses it; validating it would exhaust the stack
    raw = (
        '{"type": "message.send", "id": "d", "thread_id": "t", "text": "x", "policy": '
        + '{"a":' * depth
        + "{}"
        + "}" * depth
        + "}"
    )
    try:
        decode_frame(raw)
    except FrameError as exc:
        assert exc.code == "invalid_input"
        assert "nested too deeply" in str(exc)
    else:
        raise AssertionError("a frame nested 1000 levels deep was accepted")
