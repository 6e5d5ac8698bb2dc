"""The command table: both transports and the protocol doc agree with it, errors map one way."""

from __future__ import annotations

import re
import tempfile
import typing
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.routing import Route

import runtime.errors
from realtime.bus_errors import BusUnavailableError
from realtime.closecodes import CloseCode
from runtime.domain import Principal, Role, WaitKind
from runtime.errors import Forbidden, ThreadlineError
from runtime.service.thread_service import ThreadService
from server import protocol_catalog as protocol
from server.app import create_app
from server.auth import Unauthorized
from server.protocol.client_frames import ClientFrame, FrameError
from server.protocol.command_model import Command
from server.protocol.commands import BY_NAME, COMMANDS
from server.protocol.inputs import SendMessage
from server.protocol.wire_errors import STATUS, InvalidJSON, wire_error
from server.settings import Settings
from server.transports.http_routes import body_model

UNUSED_DB = f"sqlite:///{Path(tempfile.gettempdir()) / 'threadline-routes-unused.sqlite3'}"
ENVELOPE = {"type", "id"}
WS_ONLY_CODES = {"invalid_frame", "unknown_type", "too_many_subscriptions"}


def app_commands() -> dict[str, tuple[Route, Command[Any, Any]]]:
    """The commands behind the app's HTTP routes, read from the built app itself."""
    app = create_app(Settings(role="all", database_url=UNUSED_DB))
    found = {}
    for route in app.routes:
        command = getattr(getattr(route, "endpoint", None), "command", None)
        if isinstance(route, Route) and command is not None:
            found[command.name] = (route, command)
    return found


def union_frames() -> dict[str, type[BaseModel]]:
    union, *_ = typing.get_args(ClientFrame)
    models = typing.get_args(union)
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in models}


def test_the_doc_tables_are_generated_from_the_command_table() -> None:
    current = protocol.DOC.read_text(encoding="utf-8")
    assert protocol.render(current) == current, "run: python -m server.protocol_catalog --write"


def test_an_undocumented_command_makes_the_doc_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = Command(
        name="thread.rename",
        input=SendMessage,
        call=BY_NAME["message.send"].call,
        answer=lambda i, r: {},
        answer_doc="`{}`",
    )
    monkeypatch.setattr(protocol, "COMMANDS", (*COMMANDS, extra))
    current = protocol.DOC.read_text(encoding="utf-8")
    assert "thread.rename" in protocol.render(current)
    assert protocol.render(current) != current


def test_every_command_is_offered_somewhere_and_says_why_not_everywhere() -> None:
    for command in COMMANDS:
        assert command.http is not None or command.reply is not None or command.sse, command.name
        if command.http is None or command.reply is None:
            assert command.note, f"{command.name}: say why it has one transport only"
    assert len(BY_NAME) == len(COMMANDS), "command names must be unique"


def test_frames_and_routes_are_exactly_the_table() -> None:
    routes, frames = app_commands(), union_frames()
    assert set(frames) == {c.name for c in COMMANDS if c.reply is not None}
    assert set(routes) == {c.name for c in COMMANDS if c.http is not None}
    for route, command in routes.values():
        assert command.http is not None
        assert route.path == command.http.path and route.name == command.http.route
        assert route.methods is not None and command.http.method in route.methods


def test_http_and_websocket_share_one_input_model_per_command() -> None:
    routes, frames = app_commands(), union_frames()
    shared = set(routes) & set(frames)
    assert len(shared) >= 8, shared
    for name in shared:
        _, command = routes[name]
        frame = frames[name]
        assert issubclass(frame, command.input), name
        # The frame adds only the envelope to the input.
        assert set(frame.model_fields) - set(command.input.model_fields) <= ENVELOPE, name
        body = body_model(command)
        assert command.http is not None
        body_fields = body.model_fields if body is not None else {}
        path = set(command.http.path_fields)
        # Path and body together are exactly the input; the body's fields are the input's.
        assert path | set(body_fields) == set(command.input.model_fields), name
        assert body is None or body.model_config.get("extra") == "forbid", name
        for field, info in body_fields.items():
            source = command.input.model_fields[field]
            assert (info.annotation, info.metadata) == (source.annotation, source.metadata)
            assert frame.model_fields[field].annotation == source.annotation, (name, field)


def test_every_error_code_has_a_status_and_the_doc_agrees() -> None:
    def subclasses(cls: type[ThreadlineError]) -> set[type[ThreadlineError]]:
        return {cls} | {s for c in cls.__subclasses__() for s in subclasses(c)}

    # Imported, so every code is known: the errors of runtime, auth, the frames and the JSON.
    assert {Unauthorized, InvalidJSON, FrameError} <= subclasses(ThreadlineError)
    codes = {c.code for c in subclasses(ThreadlineError)} - {"error"}
    assert codes <= set(STATUS), codes - set(STATUS)
    doc = protocol.DOC.read_text(encoding="utf-8")
    documented = dict(re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \|", doc, re.MULTILINE))
    assert {code: int(s) for code, s in documented.items()} == STATUS
    assert all(f"`{code}`" in doc for code in WS_ONLY_CODES)


def test_every_close_code_is_documented() -> None:
    doc = protocol.DOC.read_text(encoding="utf-8")
    section = doc.split("## Close codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(code) for code in re.findall(r"^\| `(\d{4})` \|", section, re.MULTILINE)}
    assert documented == {int(code) for code in CloseCode}


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (runtime.errors.NotFound("gone"), 404, "not_found"),
        (runtime.errors.ActionConflict("won", resolved_by="bob"), 409, "conflict"),
        (runtime.errors.RunActive("busy"), 409, "run_active"),
        (runtime.errors.TooLarge("big"), 413, "too_large"),
        (runtime.errors.Unavailable("down"), 503, "unavailable"),
        (Unauthorized("who"), 401, "unauthorized"),
        (HTTPException(405, headers={"Allow": "GET"}), 405, "method_not_allowed"),
        (BusUnavailableError("redis"), 503, "unavailable"),
        (KeyError("secret detail"), 500, "internal_error"),
    ],
)
def test_one_mapping_for_http_bodies_and_error_frames(
    exc: BaseException, status: int, code: str
) -> None:
    error = wire_error(exc)
    response = error.response()
    body = orjson.loads(response.body)
    assert (response.status_code, body["error"]["code"]) == (status, code)
    frame = orjson.loads(error.frame("f1"))
    assert frame == {"type": "error", "id": "f1", **body["error"]}
    assert "secret detail" not in bytes(response.body).decode()
    if isinstance(exc, Unauthorized):
        assert response.headers["www-authenticate"] == "Bearer"
    if isinstance(exc, HTTPException):
        assert response.headers["allow"] == "GET"
    if isinstance(exc, runtime.errors.ActionConflict):
        assert frame["resolved_by"] == "bob"


def test_validation_errors_are_field_lists_on_both_transports() -> None:
    with pytest.raises(ValidationError) as info:
        SendMessage.model_validate({"thread_id": "t", "text": 3})
    error = wire_error(info.value)
    assert (error.status, error.code) == (422, "invalid_input")
    assert error.details["errors"] == [{"loc": ["text"], "msg": "Input should be a valid string"}]
    assert wire_error(info.value, invalid="invalid input").message == "invalid input"


class Untouchable:
    """A store that fails the test if the service looks anything up."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the role check must come before store.{name}")


async def test_the_service_refuses_manual_results_from_untrusted_roles_before_any_lookup() -> None:
    service = ThreadService.__new__(ThreadService)
    service.store = Untouchable()
    user = Principal(subject="u", role=Role.USER, scopes=frozenset({"a"}))
    with pytest.raises(Forbidden):
        await service.resume_action(
            user, "t", "a", {"output": 1, "error": None}, kind=WaitKind.MANUAL_RESULT
        )
    assert BY_NAME["action.manual_result"].authorize is not None
    with pytest.raises(Forbidden):
        BY_NAME["action.manual_result"].authorize(user)
    backend = Principal(subject="b", role=Role.BACKEND, scopes=frozenset({"a"}))
    with pytest.raises(AssertionError, match="before store"):
        await service.resume_action(backend, "t", "a", {}, kind=WaitKind.MANUAL_RESULT)


async def test_text_over_the_limit_is_refused_alike_on_both_transports() -> None:
    data = SendMessage(thread_id="t", text="x" * (64 * 1024 + 1))
    with pytest.raises(runtime.errors.TooLarge) as info:
        await BY_NAME["message.send"].run(None, data)  # type: ignore[arg-type]
    assert info.value.details == {"limit": 64 * 1024}
