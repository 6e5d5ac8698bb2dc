"""The sans-I/O websocket session: frames in, answers and live frames out, no sockets."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import orjson
import pytest

from realtime.envelopes import ChunkEnvelope, InvalidateEnvelope, MessageKind, encode
from realtime.outbox import Outbox
from runtime.domain import Admission, InputPolicy, Origin, Principal, Role, WaitKind
from runtime.errors import ActionConflict, NotFound
from runtime.service.thread_service import ThreadService
from runtime.storage.store import ResolveResult, RewriteResult
from server.transports.ws.session import Session, SessionClosedError

THREAD = "t-mine"
FOREIGN = "t-foreign"


class FakeStore:
    """The two reads a session makes of the store; anything else fails the test."""

    def __init__(self) -> None:
        self.threads = {THREAD: ("alpha", 4), FOREIGN: ("beta", 9)}

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the session must not call store.{name}")

    async def thread_version(self, thread_id: str, scopes: Collection[str]) -> int:
        found = self.threads.get(thread_id)
        if found is None or found[0] not in scopes:
            raise NotFound(f"thread {thread_id} not found")
        return found[1]

    async def thread_versions(self, thread_ids: Sequence[str]) -> dict[str, int]:
        return {t: self.threads[t][1] for t in thread_ids if t in self.threads}


class FakeCommands(ThreadService):
    """The service with the commands these tests drive answered here; a subclass, so mypy checks
    each signature against the real one. Not built by ThreadService.__init__: nothing else of
    it is reached."""

    store: FakeStore

    def __init__(self) -> None:
        self.store = FakeStore()
        self.calls: list[tuple[str, Any]] = []
        self.fail_with: Exception | None = None

    async def send_message(
        self,
        principal: Principal,
        thread_id: str,
        text: str,
        *,
        client_request_id: str | None = None,
        policy: InputPolicy = InputPolicy.ENQUEUE,
        client_tools: Sequence[Mapping[str, Any]] = (),
    ) -> Admission:
        kwargs = {"client_request_id": client_request_id, "policy": policy, "tools": client_tools}
        self.calls.append(("send_message", (thread_id, text, kwargs)))
        if self.fail_with is not None:
            raise self.fail_with
        await self.store.thread_version(thread_id, principal.scopes)
        return Admission(thread_id=thread_id, version=5, run_id="r1", message_id="m1")

    async def resume_action(
        self,
        principal: Principal,
        thread_id: str,
        action_id: str,
        payload: Mapping[str, Any],
        *,
        expected_version: int | None = None,
        kind: WaitKind | None = None,
        origin: Origin | None = None,
    ) -> ResolveResult:
        kwargs = {"expected_version": expected_version, "kind": kind}
        self.calls.append(("resume_action", (thread_id, action_id, dict(payload), kwargs)))
        raise ActionConflict("the action was already resolved", resolved_by={"subject": "bob"})

    async def regenerate(
        self,
        principal: Principal,
        thread_id: str,
        message_id: str | None = None,
        *,
        expected_version: int | None = None,
    ) -> RewriteResult:
        raise RuntimeError("boom")

    async def cancel_queued(self, principal: Principal, thread_id: str, item_id: str) -> int:
        await self.store.thread_version(thread_id, principal.scopes)
        return 6


class FakeHub:
    def __init__(self) -> None:
        self.listeners: dict[str, list[Any]] = {}
        self.replays: dict[str, list[bytes]] = {}
        self.on_add: Any = None

    async def add(self, thread_id: str, listener: Any) -> None:
        self.listeners.setdefault(thread_id, []).append(listener)
        if self.on_add is not None:
            self.on_add(listener)

    async def remove(self, thread_id: str, listener: Any) -> None:
        self.listeners[thread_id].remove(listener)
        if not self.listeners[thread_id]:
            del self.listeners[thread_id]

    async def replay(self, thread_id: str) -> list[bytes]:
        return list(self.replays.get(thread_id, []))

    def publish(self, thread_id: str, data: bytes, kind: MessageKind, version: int | None) -> None:
        for listener in self.listeners.get(thread_id, []):
            listener.deliver(data, kind, version)


def chunk(seq: int, run_id: str = "r1", episode: int = 1) -> bytes:
    return encode(
        ChunkEnvelope(
            thread_id=THREAD,
            run_id=run_id,
            seq=seq,
            episode=episode,
            chunk={"type": "text-delta", "delta": "x"},
        )
    )


def invalidate(version: int) -> bytes:
    return encode(InvalidateEnvelope(thread_id=THREAD, version=version))


@pytest.fixture
def parts() -> tuple[Session, FakeCommands, FakeHub, Outbox]:
    commands, hub, outbox = FakeCommands(), FakeHub(), Outbox(64 * 1024)
    principal = Principal(subject="alice", role=Role.USER, scopes=frozenset({"alpha"}))
    return Session(principal, commands, hub, outbox), commands, hub, outbox


def drain(outbox: Outbox) -> list[dict[str, Any]]:
    frames = []
    while (data := outbox.get_nowait()) is not None:
        frames.append(orjson.loads(data))
    return frames


async def test_ping_pong_echoes_id(parts: Any) -> None:
    session, _, _, outbox = parts
    await session.feed('{"type": "ping", "id": "p1"}')
    await session.feed(b'{"type": "ping"}')
    assert drain(outbox) == [{"type": "pong", "id": "p1"}, {"type": "pong"}]


@pytest.mark.parametrize(
    ("raw", "code", "frame_id"),
    [
        (b"not json", "invalid_json", None),
        (b"[1]", "invalid_frame", None),
        (b'{"id": 3}', "invalid_frame", 3),
        (b'{"type": "nope", "id": "q"}', "unknown_type", "q"),
        (b'{"type": "subscribe", "id": 5}', "invalid_input", 5),
        (b'{"type": "message.send", "thread_id": "t", "id": 6}', "invalid_input", 6),
    ],
)
async def test_bad_frames_get_error_frames_and_the_session_goes_on(
    parts: Any, raw: bytes, code: str, frame_id: Any
) -> None:
    session, commands, _, outbox = parts
    await session.feed(raw)
    (error,) = drain(outbox)
    assert error["type"] == "error" and error["code"] == code
    assert error.get("id") == frame_id
    assert error["message"]
    assert commands.calls == []
    await session.feed(b'{"type": "ping", "id": 1}')
    assert drain(outbox) == [{"type": "pong", "id": 1}]


async def test_subscribe_to_foreign_thread_is_not_found(parts: Any) -> None:
    session, _, hub, outbox = parts
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": FOREIGN, "id": 1}))
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": "t-none", "id": 2}))
    foreign, missing = drain(outbox)
    assert (foreign["code"], foreign["id"]) == ("not_found", 1)
    assert (missing["code"], missing["id"]) == ("not_found", 2)
    assert hub.listeners == {}  # never listened to a foreign channel
    assert session.subscriptions == []


async def test_subscribe_answers_version_then_replay_then_live(parts: Any) -> None:
    session, _, hub, outbox = parts
    hub.replays[THREAD] = [chunk(0), chunk(1)]
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": THREAD, "id": "s"}))
    hub.publish(THREAD, chunk(2), "chunk", None)
    frames = drain(outbox)
    assert frames[0] == {"type": "subscribed", "thread_id": THREAD, "version": 4, "id": "s"}
    assert [f["seq"] for f in frames[1:]] == [0, 1, 2]
    assert session.subscriptions == [THREAD]


async def test_frames_arriving_during_subscribe_are_held_and_deduplicated(parts: Any) -> None:
    session, _, hub, outbox = parts
    hub.replays[THREAD] = [chunk(0), chunk(1)]

    def racing_publish(listener: Any) -> None:
        # Published after the hub subscription, before `subscribed` went out.
        listener.deliver(chunk(1), "chunk", None)
        listener.deliver(chunk(2), "chunk", None)
        listener.deliver(invalidate(4), "invalidate", 4)  # not newer than `subscribed`
        listener.deliver(invalidate(5), "invalidate", 5)

    hub.on_add = racing_publish
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": THREAD}))
    frames = drain(outbox)
    assert frames[0]["type"] == "subscribed"
    assert [(f["type"], f.get("seq", f.get("version"))) for f in frames[1:]] == [
        ("chunk", 0),
        ("chunk", 1),
        ("chunk", 2),
        ("invalidate", 5),
    ]


async def test_a_replayed_chunk_arriving_live_after_subscribed_is_not_sent_twice(
    parts: Any,
) -> None:
    # Publishing and appending to the replay run concurrently: the replay can already hold a
    # chunk whose live copy reaches the listener only after `subscribed` went out.
    session, _, hub, outbox = parts
    hub.replays[THREAD] = [chunk(0), chunk(1), chunk(0, run_id="r0")]
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": THREAD}))
    for data in (chunk(1), chunk(2), chunk(1, run_id="r0"), chunk(3)):
        hub.publish(THREAD, data, "chunk", None)
    frames = drain(outbox)[1:]
    assert [(f["run_id"], f["seq"]) for f in frames] == [
        ("r1", 0),
        ("r1", 1),
        ("r0", 0),
        ("r1", 2),
        ("r0", 1),
        ("r1", 3),
    ]


async def test_a_takeover_after_the_replay_passes_with_its_repeated_seqs(parts: Any) -> None:
    session, _, hub, outbox = parts
    hub.replays[THREAD] = [chunk(0), chunk(1), chunk(2)]
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": THREAD}))
    for data in (chunk(2), chunk(0, episode=2), chunk(1, episode=2)):
        hub.publish(THREAD, data, "chunk", None)
    frames = drain(outbox)[1:]
    assert [(f["episode"], f["seq"]) for f in frames] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]


async def test_invalidations_coalesce_and_never_decrease(parts: Any) -> None:
    session, _, hub, outbox = parts
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": THREAD}))
    drain(outbox)
    for version in (6, 8, 7, 3, 4):
        hub.publish(THREAD, invalidate(version), "invalidate", version)
    assert drain(outbox) == [{"type": "invalidate", "thread_id": THREAD, "version": 8}]
    hub.publish(THREAD, invalidate(8), "invalidate", 8)
    hub.publish(THREAD, invalidate(9), "invalidate", 9)
    assert [f["version"] for f in drain(outbox)] == [9]


async def test_chunks_keep_order_around_a_coalesced_invalidation(parts: Any) -> None:
    session, _, hub, outbox = parts
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": THREAD}))
    drain(outbox)
    hub.publish(THREAD, invalidate(5), "invalidate", 5)
    hub.publish(THREAD, chunk(0), "chunk", None)
    hub.publish(THREAD, invalidate(6), "invalidate", 6)
    frames = drain(outbox)
    # The newer invalidation replaced the older one and is never ahead of the earlier chunk.
    assert [(f["type"], f.get("seq", f.get("version"))) for f in frames] == [
        ("chunk", 0),
        ("invalidate", 6),
    ]


async def test_unsubscribe_and_close_release_hub_listeners(parts: Any) -> None:
    session, _, hub, outbox = parts
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": THREAD}))
    hub.publish(THREAD, chunk(0), "chunk", None)
    await session.feed(orjson.dumps({"type": "unsubscribe", "thread_id": THREAD, "id": 2}))
    frames = drain(outbox)
    # The queued chunk of the unsubscribed thread was discarded.
    assert [f["type"] for f in frames] == ["subscribed", "unsubscribed"]
    assert hub.listeners == {}
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": THREAD}))
    await session.close()
    assert hub.listeners == {}
    with pytest.raises(SessionClosedError):
        await session.feed(b'{"type": "ping"}')


async def test_resubscribe_is_idempotent(parts: Any) -> None:
    session, _, hub, outbox = parts
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": THREAD}))
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": THREAD, "id": 2}))
    assert [f["type"] for f in drain(outbox)] == ["subscribed", "subscribed"]
    assert len(hub.listeners[THREAD]) == 1


async def test_subscription_limit(parts: Any) -> None:
    session, commands, _, outbox = parts
    session.max_subscriptions = 1
    commands.store.threads["t-two"] = ("alpha", 1)
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": THREAD}))
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": "t-two", "id": 3}))
    assert drain(outbox)[-1]["code"] == "too_many_subscriptions"


async def test_commands_ack_with_the_http_answer(parts: Any) -> None:
    session, commands, _, outbox = parts
    send = {"type": "message.send", "thread_id": THREAD, "text": "hi", "policy": "reject"}
    await session.feed(orjson.dumps({**send, "id": "m"}))
    assert drain(outbox) == [
        {
            "type": "ack",
            "id": "m",
            "thread_id": THREAD,
            "version": 5,
            "run_id": "r1",
            "message_id": "m1",
        }
    ]
    name, (_, text, kwargs) = commands.calls[0]
    assert (name, text, kwargs["policy"].value) == ("send_message", "hi", "reject")
    await session.feed(
        orjson.dumps({"type": "queue.cancel", "thread_id": THREAD, "item_id": "q", "id": 1})
    )
    assert drain(outbox) == [{"type": "ack", "id": 1, "thread_id": THREAD, "version": 6}]


async def test_command_errors_carry_code_details_and_id(parts: Any) -> None:
    session, _, _, outbox = parts
    resume = {"type": "action.resume", "thread_id": THREAD, "action_id": "a", "payload": {}}
    await session.feed(orjson.dumps({**resume, "id": 4}))
    (conflict,) = drain(outbox)
    assert conflict["code"] == "conflict" and conflict["id"] == 4
    assert conflict["resolved_by"] == {"subject": "bob"}
    send = {"type": "message.send", "thread_id": FOREIGN, "text": "x", "id": 5}
    await session.feed(orjson.dumps(send))
    assert drain(outbox)[0]["code"] == "not_found"


async def test_manual_result_needs_a_trusted_role(parts: Any) -> None:
    session, commands, _, outbox = parts
    frame = {"type": "action.manual_result", "thread_id": THREAD, "action_id": "a", "id": 1}
    await session.feed(orjson.dumps(frame))
    (error,) = drain(outbox)
    assert (error["code"], error["id"]) == ("forbidden", 1)
    assert commands.calls == []
    client = {"type": "action.client_result", "thread_id": THREAD, "action_id": "a", "output": 2}
    await session.feed(orjson.dumps(client))
    assert drain(outbox)[0]["code"] == "conflict"
    _, (_, _, payload, kwargs) = commands.calls[0]
    assert payload == {"output": 2, "error": None}
    assert kwargs["kind"].value == "client-tool"


async def test_unexpected_failure_is_internal_error_and_session_survives(parts: Any) -> None:
    session, _, _, outbox = parts
    await session.feed(orjson.dumps({"type": "regenerate", "thread_id": THREAD, "id": 7}))
    (error,) = drain(outbox)
    assert (error["code"], error["id"]) == ("internal_error", 7)
    assert "boom" not in error["message"]
    await session.feed(b'{"type": "ping"}')
    assert drain(outbox) == [{"type": "pong"}]


async def test_overflow_is_signalled_to_the_gateway() -> None:
    overflowed: list[bool] = []
    outbox = Outbox(4096, hard_limit=8192, on_overflow=lambda: overflowed.append(True))
    principal = Principal(subject="a", role=Role.USER, scopes=frozenset({"alpha"}))
    hub = FakeHub()
    session = Session(principal, FakeCommands(), hub, outbox)
    await session.feed(orjson.dumps({"type": "subscribe", "thread_id": THREAD}))
    for seq in range(200):  # nobody drains: the consumer is too slow
        hub.publish(THREAD, chunk(seq), "chunk", None)
    assert overflowed == [True]
    assert outbox.overflowed
