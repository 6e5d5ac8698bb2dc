"""Inputs storage or the encoder would refuse (NUL characters, over-deep JSON) are invalid_input
on both transports, naming the field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from server.protocol.client_frames import FrameError, decode_frame
from server.protocol.inputs import (
    MAX_JSON_DEPTH,
    CreateThread,
    ResumeAction,
    SendMessage,
    ToolResult,
)


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("model", "fields", "field"),
    [
        (SendMessage, {"thread_id": "th_1", "text": "a\x00b"}, "text"),
        (SendMessage, {"thread_id": "th\x001", "text": "hi"}, "thread_id"),
        (
            SendMessage,
            {"thread_id": "th_1", "text": "hi", "client_request_id": "r\x00"},
            "client_request_id",
        ),
        (CreateThread, {"title": "t\x00"}, "title"),
        (CreateThread, {"metadata": {"k": ["ok", "b\x00d"]}}, "metadata"),
        (
            ResumeAction,
            {"thread_id": "t", "action_id": "a", "payload": nested(MAX_JSON_DEPTH + 1)},
            "payload",
        ),
        (ToolResult, {"thread_id": "t", "action_id": "a", "output": nested(300)}, "output"),
        (ToolResult, {"thread_id": "t", "action_id": "a", "output": {"k\x00": 1}}, "output"),
    ],
)
def test_unstorable_fields_are_refused_by_name(
    model: type[Any], fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(fields)
    assert [error["loc"] for error in caught.value.errors()] == [(field,)]


def test_storable_values_pass() -> None:
    ResumeAction.model_validate(
        {"thread_id": "t", "action_id": "a", "payload": nested(MAX_JSON_DEPTH - 1)}
    )
    SendMessage.model_validate({"thread_id": "th_1", "text": "tab\tand newline\n are fine"})


def test_websocket_frames_name_the_field_too() -> None:
    frame = {"type": "message.send", "id": 1, "thread_id": "th_1", "text": "a\x00b"}
    with pytest.raises(FrameError) as caught:
        decode_frame(orjson.dumps(frame))
    assert caught.value.code == "invalid_input"
    assert [e["loc"] for e in caught.value.details["errors"]] == [["text"]]
