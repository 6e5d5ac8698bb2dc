"""The Python client reads the server's snapshot, parts and chunks as the server's own models."""

from __future__ import annotations

from typing import Any

from runtime import domain
from server.protocol import answers
from threadline_client import (
    Message,
    OtherPart,
    Principal,
    QueuedItemView,
    Role,
    RunStatus,
    Snapshot,
    TextDeltaChunk,
    TextPart,
    ThreadPage,
    ToolCallPart,
    ToolState,
    WaitKind,
)
from threadline_client.models import ACTIVE_RUN_STATUSES, typed_chunk
from threadline_wire import chunks, message_parts


def _server_snapshot() -> domain.Snapshot:
    waiting = domain.Waiting(
        action_id="act-1",
        kind=domain.WaitKind.APPROVAL,
        payload_schema={"type": "object"},
        allowed_roles=(domain.Role.USER,),
    )
    tool = domain.ToolCallPart(
        tool_call_id="call-1",
        name="send_email",
        input={"to": "a@example.com"},
        state=domain.ToolState.AWAITING_ACTION,
        waiting=waiting,
    )
    message = domain.MessageView(
        id="m1",
        role=domain.MessageRole.ASSISTANT,
        visibility=domain.Visibility.VISIBLE,
        parts=(domain.TextPart(text="hello "), tool),
        run_id="r1",
    )
    return domain.Snapshot(
        thread=domain.ThreadView(id="t1", scope="s", title="", version=3, metadata={}),
        messages=(message,),
        pending_actions=tuple(
            domain.pending_actions_of(
                domain.Message(
                    id="m1",
                    thread_id="t1",
                    position=0,
                    role=domain.MessageRole.ASSISTANT,
                    parts=message.parts,
                    run_id="r1",
                    created_at=0.0,
                    updated_at=0.0,
                )
            )
        ),
        run=domain.RunView(id="r1", status=domain.RunStatus.WAITING),
        queue=(domain.QueuedItemView(id="q1", text="next", submitted_by="alice"),),
    )


def test_a_snapshot_the_server_writes_reads_back_typed() -> None:
    server = _server_snapshot()
    client = Snapshot.model_validate(server.to_wire())
    message = client.messages[0]
    text, tool = message.parts
    assert isinstance(text, TextPart) and text.text == "hello "
    assert isinstance(tool, ToolCallPart) and tool.state is ToolState.AWAITING_ACTION
    assert tool.waiting is not None and tool.waiting.kind is WaitKind.APPROVAL
    assert message.text == "hello "
    assert client.run is not None and client.run.status is RunStatus.WAITING
    assert client.run.status in ACTIVE_RUN_STATUSES
    assert client.queue == [QueuedItemView(id="q1", text="next", submitted_by="alice")]
    assert client.pending_actions[0].kind is WaitKind.APPROVAL
    assert client.pending_actions[0].thread_id == "t1"


def test_the_server_parts_are_the_wire_models() -> None:
    # One definition: the server's strict parts extend the wire's, the enums are the same.
    assert issubclass(domain.TextPart, message_parts.TextPart)
    assert issubclass(domain.ToolCallPart, message_parts.ToolCallPart)
    assert issubclass(domain.QueuedItemView, message_parts.QueuedItemView)
    assert issubclass(domain.RunView, message_parts.RunView)
    assert issubclass(domain.PendingAction, message_parts.PendingAction)
    assert domain.RunStatus is RunStatus and domain.ToolState is ToolState
    part = domain.TextPart(text="x")
    assert TextPart.model_validate(part.model_dump()) == TextPart(text="x")


def test_an_unknown_part_or_chunk_from_a_newer_server_is_kept() -> None:
    raw: dict[str, Any] = {"id": "m", "role": "assistant", "parts": [{"type": "image", "u": 1}]}
    (part,) = Message.model_validate(raw).parts
    assert isinstance(part, OtherPart) and part.type == "image"
    assert part.model_extra == {"u": 1}
    assert typed_chunk({"type": "audio-delta", "b": "x"}) == {"type": "audio-delta", "b": "x"}


def test_a_chunk_reads_as_the_runtime_s_own_model() -> None:
    chunk = typed_chunk({"type": "text-delta", "delta": "hi"})
    assert isinstance(chunk, TextDeltaChunk) and chunk.delta == "hi"
    assert chunks.TextDeltaChunk is TextDeltaChunk


def test_the_server_answers_are_the_wire_answers_the_client_reads() -> None:
    thread = domain.Thread(
        id="t1",
        scope="s",
        title="x",
        version=2,
        metadata={"k": "v"},
        private_metadata={"secret": 1},
        created_at=1.0,
        updated_at=2.0,
    )
    body = answers.threads_answer([thread], limit=1)
    assert set(body["threads"][0]) == {
        "id", "scope", "title", "version", "metadata", "owner", "created_at", "updated_at"
    }  # fmt: skip
    page = ThreadPage.model_validate(body)
    assert page.threads[0].metadata == {"k": "v"} and page.next_cursor is not None
    principal = domain.Principal(subject="ann", role=domain.Role.USER, scopes=frozenset({"s"}))
    me = Principal.model_validate(answers.principal_answer(principal))
    assert me.role is Role.USER and me.name == "ann"
    assert answers.metadata_answer(thread) == {
        "thread_id": "t1",
        "version": 2,
        "metadata": {"k": "v"},
    }
