"""The thread feed behind AG-UI and AI SDK streams, and their chunk mappings, with no server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest
from ag_ui.core import Event, StateSnapshotEvent
from pydantic import TypeAdapter

from realtime.envelopes import ChunkEnvelope, InvalidateEnvelope, ResyncEnvelope, encode
from runtime.domain import Principal, Role, Snapshot
from server.protocol.command_model import Caller
from server.transports.sse.agui import RunStream, agui_messages
from server.transports.sse.aisdk import UIStream, stream_run
from server.transports.sse.thread_stream import Chunk, Committed, ThreadFeed

THREAD = "t1"
RUN = "r1"
EVENTS: TypeAdapter[Any] = TypeAdapter(Event)
PRINCIPAL = Principal(subject="alice", role=Role.USER, scopes=frozenset({"alpha"}))


def snap(version: int, status: str = "running", next_seq: int = 0, **extra: Any) -> Snapshot:
    return Snapshot.model_validate(
        {
            "thread": {
                "id": THREAD,
                "scope": "alpha",
                "title": "",
                "version": version,
                "metadata": {},
            },
            "messages": extra.get("messages", []),
            "pending_actions": extra.get("pending_actions", []),
            "run": {"id": RUN, "status": status, "next_seq": next_seq},
            "queue": [],
        }
    )


def chunk(seq: int, body: dict[str, Any], run_id: str = RUN) -> bytes:
    return encode(ChunkEnvelope(thread_id=THREAD, run_id=run_id, seq=seq, chunk=body))


def delta(seq: int, text: str = "x") -> bytes:
    return chunk(seq, {"type": "text-delta", "delta": text})


class FakeService:
    authorize_hook = None  # no authorization hook: the command path asks none

    def __init__(self, snapshots: list[Snapshot]) -> None:
        self.snapshots = snapshots

    async def snapshot(self, principal: Principal, thread_id: str, **read: Any) -> Snapshot:
        return self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]


class FakeHub:
    def __init__(self, replays: list[list[bytes]]) -> None:
        self.replays = replays
        self.listeners: list[Any] = []

    async def add(self, thread_id: str, listener: Any) -> None:
        self.listeners.append(listener)

    async def remove(self, thread_id: str, listener: Any) -> None:
        self.listeners.remove(listener)

    async def replay(self, thread_id: str) -> list[bytes]:
        return self.replays.pop(0) if len(self.replays) > 1 else self.replays[0]

    def send(self, data: bytes) -> None:
        kind = orjson.loads(data)["type"]
        for listener in self.listeners:
            listener.deliver(data, kind, None)


async def collect(feed: ThreadFeed, hub: FakeHub, live: list[bytes], count: int) -> list[Any]:
    out: list[Any] = []
    async with feed:
        for data in live:
            hub.send(data)
        async with asyncio.timeout(5):
            async for event in feed.events():
                out.append(event)
                if len(out) == count:
                    break
    assert not hub.listeners, "the feed stopped listening when closed"
    return out


def seqs(events: list[Any]) -> list[Any]:
    return [e.seq if isinstance(e, Chunk) else ("reset" if e.reset else "snap") for e in events]


async def test_replay_then_live_each_chunk_once_in_order() -> None:
    # Chunks 0-1 are committed (next_seq 2); the replay holds 2-3; live repeats 3 and adds 4.
    service = FakeService([snap(5, next_seq=2)])
    hub = FakeHub([[delta(1), delta(2), delta(3)]])
    feed = ThreadFeed(Caller(PRINCIPAL, service), hub, THREAD)  # type: ignore[arg-type]
    events = await collect(feed, hub, [delta(3), delta(4)], 4)
    assert seqs(events) == ["snap", 2, 3, 4]


async def test_a_live_gap_rereads_snapshot_and_replay() -> None:
    service = FakeService([snap(5, next_seq=0), snap(6, next_seq=3)])
    hub = FakeHub([[delta(0)], [delta(3)]])
    feed = ThreadFeed(Caller(PRINCIPAL, service), hub, THREAD)  # type: ignore[arg-type]
    events = await collect(feed, hub, [delta(2)], 4)
    assert seqs(events) == ["snap", 0, "reset", 3]


async def test_a_resync_rereads_snapshot_and_replay() -> None:
    service = FakeService([snap(5), snap(6, next_seq=1)])
    hub = FakeHub([[delta(0)], [delta(1)]])
    feed = ThreadFeed(Caller(PRINCIPAL, service), hub, THREAD)  # type: ignore[arg-type]
    events = await collect(feed, hub, [encode(ResyncEnvelope(thread_id=THREAD))], 4)
    assert seqs(events) == ["snap", 0, "reset", 1]


@pytest.mark.parametrize(
    ("append_only", "after"), [(True, [2]), (False, [0, 1, 2])], ids=["ai-sdk", "ag-ui"]
)
async def test_a_resync_mid_step_resends_the_step_only_to_streams_that_replace_it(
    append_only: bool, after: list[int]
) -> None:
    # Nothing committed (next_seq 0 both times): after the resync the replay still holds 0-1,
    # already sent. An AI SDK stream cannot take text back (sent again, it shows twice); AG-UI
    # replaces the partial message on the reset and needs the step again.
    service = FakeService([snap(5), snap(6)])
    hub = FakeHub([[delta(0), delta(1)], [delta(0), delta(1), delta(2)]])
    feed = ThreadFeed(Caller(PRINCIPAL, service), hub, THREAD)  # type: ignore[arg-type]
    feed.append_only = append_only
    events = await collect(feed, hub, [encode(ResyncEnvelope(thread_id=THREAD))], 4 + len(after))
    assert seqs(events) == ["snap", 0, 1, "reset", *after]


async def test_a_takeover_voids_what_the_old_worker_streamed() -> None:
    # The new worker redoes the step from the committed next_seq (0): its seqs repeat.
    takeover = chunk(0, {"type": "run-takeover", "episode": 2})
    service = FakeService([snap(5)])
    hub = FakeHub(
        [[delta(0, "old"), delta(1, "old")], [delta(0, "old"), takeover, delta(1, "new")]]
    )
    feed = ThreadFeed(Caller(PRINCIPAL, service), hub, THREAD)  # type: ignore[arg-type]
    events = await collect(feed, hub, [takeover], 6)
    assert seqs(events) == ["snap", 0, 1, "reset", 0, 1]
    assert events[-1].chunk["delta"] == "new"


async def test_a_trimmed_replay_is_streamed_after_one_retry() -> None:
    # The replay starts at 5 but the run's next_seq is 2: after one re-read, stream what is there.
    service = FakeService([snap(5, next_seq=2)])
    hub = FakeHub([[delta(5), delta(6)]])
    feed = ThreadFeed(Caller(PRINCIPAL, service), hub, THREAD)  # type: ignore[arg-type]
    events = await collect(feed, hub, [], 4)
    assert seqs(events) == ["snap", "reset", 5, 6]


async def test_invalidations_yield_committed_state_without_reset() -> None:
    service = FakeService([snap(5), snap(6, status="completed", next_seq=3)])
    hub = FakeHub([[]])
    feed = ThreadFeed(Caller(PRINCIPAL, service), hub, THREAD)  # type: ignore[arg-type]
    invalidate = encode(InvalidateEnvelope(thread_id=THREAD, version=6))
    events = await collect(feed, hub, [invalidate], 2)
    assert isinstance(events[1], Committed) and not events[1].reset
    assert events[1].snapshot.run is not None and events[1].snapshot.run.status == "completed"


async def test_chunks_queued_behind_an_invalidation_are_streamed_even_once_committed() -> None:
    """Campaign finding (AI SDK stream text): an invalidation of another commit was read as a
    snapshot taken after the step committed; its next_seq made the step's chunks still queued
    behind it 'old', so an AI SDK stream, which never re-sends a committed step, lost them.

    Breaks with: the invalidation's snapshot raising `expected` to the run's next_seq."""
    service = FakeService([snap(5, next_seq=0), snap(7, next_seq=3)])
    hub = FakeHub([[delta(0)]])
    feed = ThreadFeed(Caller(PRINCIPAL, service), hub, THREAD)  # type: ignore[arg-type]
    invalidate = encode(InvalidateEnvelope(thread_id=THREAD, version=6))
    events = await collect(feed, hub, [invalidate, delta(1), delta(2), delta(3)], 5)
    assert seqs(events) == ["snap", 0, "snap", 1, 2]


async def test_an_ai_sdk_stream_shows_the_chunks_queued_behind_the_snapshot_that_ended_it() -> None:
    """Campaign finding (AI SDK stream text): the invalidation of an earlier commit was read
    as a snapshot taken after the run completed; the stream finished there, without the text
    whose chunks were still queued behind it.

    Breaks with: stream_run finishing on the first settled snapshot whatever it has shown."""
    service = FakeService([snap(5, next_seq=0), snap(7, status="completed", next_seq=3)])
    hub = FakeHub([[]])
    feed = ThreadFeed(Caller(PRINCIPAL, service), hub, THREAD)  # type: ignore[arg-type]
    invalidate = encode(InvalidateEnvelope(thread_id=THREAD, version=6))
    parts: list[dict[str, Any]] = []
    async with feed:
        for data in (delta(0, "Hel"), invalidate, delta(1, "lo"), delta(2, "!")):
            hub.send(data)
        async with asyncio.timeout(5):
            async for part in stream_run(feed, RUN, set()):
                parts.append(part)
    shown = "".join(p["delta"] for p in parts if p["type"] == "text-delta")
    assert shown == "Hello!"
    assert parts[-1] == {"type": "finish", "finishReason": "stop"}


async def test_an_ai_sdk_stream_sends_from_storage_a_step_none_of_whose_chunks_it_saw() -> None:
    """Campaign finding (AI SDK resume, no fault): the step's chunks were published before the
    stream subscribed and the replay was cleared by the step's commit before it was read; the
    stream finished without the run's text.

    Breaks with: stream_run finishing without sending the run's unseen committed messages."""
    reply = {
        "id": "a",
        "role": "assistant",
        "run_id": RUN,
        "visibility": "visible",
        "parts": [{"type": "text", "text": "Hello"}],
    }
    done = snap(7, status="completed", next_seq=2, messages=[reply])
    service = FakeService([snap(5, next_seq=0), done])
    hub = FakeHub([[]])
    feed = ThreadFeed(Caller(PRINCIPAL, service), hub, THREAD)  # type: ignore[arg-type]
    invalidate = encode(InvalidateEnvelope(thread_id=THREAD, version=7))
    parts: list[dict[str, Any]] = []
    async with feed:
        hub.send(invalidate)
        async with asyncio.timeout(10):
            async for part in stream_run(feed, RUN, set()):
                parts.append(part)
    assert "".join(p["delta"] for p in parts if p["type"] == "text-delta") == "Hello"
    assert parts[-1] == {"type": "finish", "finishReason": "stop"}


STEP: list[dict[str, Any]] = [
    {"type": "step-start", "step": 0},
    {"type": "text-delta", "delta": "Hel"},
    {"type": "text-delta", "delta": "lo"},
    {"type": "tool-call", "tool_call_id": "c1", "name": "get_weather", "input": {"city": "Oslo"}},
    {"type": "tool-state", "tool_call_id": "c1", "state": "running"},
    {"type": "tool-state", "tool_call_id": "c1", "state": "output-available", "output": {"t": 1}},
]


@pytest.mark.parametrize(
    ("status", "last"),
    [("completed", "RUN_FINISHED"), ("cancelled", "RUN_FINISHED"), ("failed", "RUN_ERROR")],
)
def test_agui_events_validate_and_close_what_is_open(status: str, last: str) -> None:
    stream = RunStream(THREAD, RUN)
    events = [e for seq, body in enumerate(STEP) for e in stream.chunk(Chunk(RUN, seq, body))]
    events += stream.finish(snap(9, status=status))
    wire = [e.model_dump_json(by_alias=True) for e in events]
    types = [EVENTS.validate_json(line).type for line in wire]
    # The step ends before the run; the committed messages and the shared state come between.
    assert types[-1] == last and types[-4] == "STEP_FINISHED"
    assert types[-3:-1] == ["MESSAGES_SNAPSHOT", "STATE_SNAPSHOT"]
    assert types.count("TEXT_MESSAGE_START") == types.count("TEXT_MESSAGE_END") == 1
    assert "TOOL_CALL_RESULT" in types


def test_agui_interrupt_carries_the_action_schema() -> None:
    schema = {
        "type": "object",
        "properties": {"approved": {"type": "boolean"}},
        "required": ["approved"],
    }
    waiting = snap(
        9,
        status="waiting",
        pending_actions=[
            {
                "id": "a1",
                "kind": "approval",
                "run_id": RUN,
                "message_id": "m1",
                "tool_call_id": "c1",
                "tool_name": "send_email",
                "input": {},
                "schema": schema,
                "allowed_roles": ["user"],
            }
        ],
    )
    [*_, finished] = RunStream(THREAD, RUN).finish(waiting)
    outcome = orjson.loads(finished.model_dump_json(by_alias=True))["outcome"]
    assert outcome["type"] == "interrupt"
    [interrupt] = outcome["interrupts"]
    assert interrupt["id"] == "a1" and interrupt["toolCallId"] == "c1"
    assert interrupt["responseSchema"] == schema


def test_agui_messages_follow_the_committed_order() -> None:
    committed = snap(
        3,
        status="completed",
        messages=[
            {
                "id": "u",
                "role": "user",
                "visibility": "visible",
                "parts": [{"type": "text", "text": "hi"}],
            },
            {
                "id": "a",
                "role": "assistant",
                "visibility": "visible",
                "parts": [
                    {
                        "type": "tool-call",
                        "tool_call_id": "c1",
                        "name": "f",
                        "input": {"x": 1},
                        "state": "output-available",
                        "output": [1],
                    }
                ],
            },
        ],
    )
    dumped = [m.model_dump(by_alias=True) for m in agui_messages(committed)]
    assert [(m["id"], m["role"]) for m in dumped] == [
        ("u", "user"),
        ("a", "assistant"),
        ("result-c1", "tool"),
    ]
    assert dumped[1]["toolCalls"][0]["function"]["arguments"] == '{"x":1}'


def test_ui_message_chunks_of_a_step() -> None:
    stream = UIStream(RUN)
    out = [c for seq, body in enumerate(STEP) for c in stream.chunk(Chunk(RUN, seq, body))]
    out += stream.finish(snap(9, status="completed"))
    assert [c["type"] for c in out] == [
        "start-step",
        "text-start",
        "text-delta",
        "text-delta",
        "text-end",
        "tool-input-start",
        "tool-input-delta",
        "tool-input-available",
        "tool-output-available",
        "finish",
    ]
    assert out[-1]["finishReason"] == "stop"


def test_agui_shared_state_is_a_snapshot_then_deltas_of_what_changed() -> None:
    stream = RunStream(THREAD, RUN)
    running = snap(7, status="running")
    waiting = snap(
        8,
        status="waiting",
        pending_actions=[
            {
                "id": "a1",
                "kind": "approval",
                "run_id": RUN,
                "message_id": "m1",
                "tool_call_id": "c1",
                "tool_name": "send_email",
                "input": {"to": "x@example.com"},
                "schema": {},
                "allowed_roles": ["user"],
            }
        ],
    )
    [first] = stream.state_events(running)
    assert isinstance(first, StateSnapshotEvent)
    assert first.snapshot == {"run": {"id": RUN, "status": "running"}, "pendingActions": []}
    assert stream.state_events(snap(7, status="running")) == []  # nothing changed: no event
    [delta] = stream.state_events(waiting)
    assert delta.type == "STATE_DELTA"
    wire = delta.model_dump_json(by_alias=True)
    assert json.loads(wire)["delta"] == [
        {"op": "replace", "path": "/run", "value": {"id": RUN, "status": "waiting"}},
        {
            "op": "replace",
            "path": "/pendingActions",
            "value": [
                {
                    "id": "a1",
                    "kind": "approval",
                    "toolName": "send_email",
                    "toolCallId": "c1",
                    "runId": RUN,
                    "allowedRoles": ["user"],
                }
            ],
        },
    ]
    EVENTS.validate_json(wire)
