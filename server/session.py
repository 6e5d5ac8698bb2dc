"""Sans-I/O websocket session: feed it decoded client frames, it queues answers in an outbox."""

from __future__ import annotations

import enum
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from pydantic import ValidationError

from realtime.envelopes import MessageKind
from realtime.errors import BusError
from realtime.outbox import Outbox
from runtime.errors import ThreadlineError
from runtime.models import InputPolicy, Principal, Thread, Visibility, WaitKind
from server.answers import admission_answer, regenerate_answer, stop_answer, version_answer
from server.auth import require_trusted
from server.errors import validation_errors
from server.frames import (
    Ack,
    ActionClientResult,
    ActionManualResult,
    ActionResume,
    ClientFrame,
    ErrorFrame,
    FrameError,
    MessageSend,
    MessageVisibility,
    Ping,
    Pong,
    QueueCancel,
    Regenerate,
    RunStop,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    decode_frame,
)

log = logging.getLogger(__name__)

MAX_SUBSCRIPTIONS = 256
# Outbox kind of direct answers: not coalesced, sent in order with the chunks around them.
ANSWER = "answer"


class ThreadReader(Protocol):
    """The two store reads a session needs (scope check and current version)."""

    async def get_thread(self, thread_id: str, scopes: Collection[str]) -> Thread: ...
    async def thread_versions(self, thread_ids: Sequence[str]) -> dict[str, int]: ...


class Commands(Protocol):
    """The command facade (runtime.service.ThreadService) as the session uses it."""

    @property
    def store(self) -> Any: ...

    async def send_message(
        self,
        principal: Principal,
        thread_id: str,
        text: str,
        *,
        client_request_id: str | None = ...,
        policy: InputPolicy = ...,
        client_tools: Sequence[Mapping[str, Any]] = ...,
    ) -> Any: ...
    async def resume_action(
        self,
        principal: Principal,
        thread_id: str,
        action_id: str,
        payload: Mapping[str, Any],
        *,
        expected_version: int | None = ...,
        kind: WaitKind | None = ...,
    ) -> Any: ...
    async def stop_run(self, principal: Principal, thread_id: str, run_id: str) -> Any: ...
    async def regenerate(
        self, principal: Principal, thread_id: str, message_id: str | None = ...
    ) -> Any: ...
    async def set_visibility(
        self, principal: Principal, thread_id: str, message_id: str, visibility: Visibility
    ) -> Any: ...
    async def cancel_queued(self, principal: Principal, thread_id: str, item_id: str) -> int: ...


class Listening(Protocol):
    """The process's fan-out hub (realtime.hub.Hub) as the session uses it."""

    async def add(self, thread_id: str, listener: Any) -> None: ...
    async def remove(self, thread_id: str, listener: Any) -> None: ...
    async def replay(self, thread_id: str) -> list[bytes]: ...


class SessionState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


class SessionClosedError(RuntimeError):
    pass


@dataclass(eq=False)
class ThreadListener:
    """Hub listener of one subscribed thread: holds live frames back until `subscribed` is out.

    The hub delivers from the moment the listener is added, but the client must see
    `subscribed` and the replay of the in-flight step first; frames arriving meanwhile wait
    here and are merged (without duplicating replayed chunks) when the subscription opens.
    """

    thread_id: str
    outbox: Outbox
    floor: int | None = None
    held: list[tuple[bytes, MessageKind, int | None]] | None = field(default_factory=list)

    def deliver(self, data: bytes, kind: MessageKind, version: int | None) -> None:
        if self.held is not None:
            self.held.append((data, kind, version))
            return
        self._put(data, kind, version)

    def _put(self, data: bytes, kind: MessageKind, version: int | None) -> None:
        # The client got `floor` in `subscribed`; it needs only newer versions.
        stale = version is not None and self.floor is not None and version <= self.floor
        if kind == "invalidate" and stale:
            return
        self.outbox.put(data, kind, self.thread_id, version)

    def open(self, version: int, replay: list[bytes]) -> None:
        """Send what was held after the replay, dropping chunks the replay already had."""
        self.floor = version
        replayed = {key for key in map(_chunk_key, replay) if key is not None}
        for data in replay:
            self.outbox.put(data, "chunk", self.thread_id)
        held, self.held = self.held or [], None
        for data, kind, item_version in held:
            if kind == "chunk" and _chunk_key(data) in replayed:
                continue
            self._put(data, kind, item_version)


def _chunk_key(data: bytes) -> tuple[str, int] | None:
    try:
        frame = orjson.loads(data)
        return str(frame["run_id"]), int(frame["seq"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


class Session:
    """One websocket connection's protocol state, with no socket in it.

    `feed()` takes a client frame (text or bytes), runs it, and queues the answer (and any
    subscription traffic) in `outbox`; the gateway writes the outbox to the socket. Every
    failure of a frame becomes an error frame: the connection itself never fails because of
    one frame.
    """

    def __init__(
        self,
        principal: Principal,
        commands: Commands,
        hub: Listening,
        outbox: Outbox,
        *,
        max_subscriptions: int = MAX_SUBSCRIPTIONS,
    ) -> None:
        self.principal = principal
        self.commands = commands
        self.hub = hub
        self.outbox = outbox
        self.max_subscriptions = max_subscriptions
        self.state = SessionState.OPEN
        self._listeners: dict[str, ThreadListener] = {}

    @property
    def subscriptions(self) -> list[str]:
        return list(self._listeners)

    @property
    def store(self) -> ThreadReader:
        reader: ThreadReader = self.commands.store
        return reader

    # --- input --------------------------------------------------------------------------

    async def feed(self, raw: str | bytes) -> None:
        """Handle one client frame; its answer (or error frame) is queued in the outbox."""
        if self.state is not SessionState.OPEN:
            raise SessionClosedError("the session is closed")
        try:
            frame = decode_frame(raw)
        except FrameError as exc:
            self._answer(exc.to_frame().to_bytes())
            return
        try:
            await self.handle(frame)
        except ThreadlineError as exc:
            self._error(frame.id, exc.code, exc.message, **exc.details)
        except ValidationError as exc:
            self._error(
                frame.id, "invalid_input", "invalid input", errors=validation_errors(exc)
            )
        except BusError as exc:
            self._error(frame.id, "unavailable", f"live delivery is unavailable: {exc}")
        except Exception:
            log.exception("websocket frame %s failed", frame.type)
            self._error(frame.id, "internal_error", "an unexpected error occurred")

    async def handle(self, frame: ClientFrame) -> None:
        """Run one validated frame. Commands are the same ThreadService calls as over HTTP."""
        principal = self.principal
        commands = self.commands
        match frame:
            case Ping():
                self._answer(Pong(id=frame.id).to_bytes())
            case Subscribe():
                await self._subscribe(frame)
            case Unsubscribe():
                await self._unsubscribe(frame.thread_id)
                self._answer(Unsubscribed(thread_id=frame.thread_id, id=frame.id).to_bytes())
            case MessageSend():
                admission = await commands.send_message(
                    principal,
                    frame.thread_id,
                    frame.text,
                    client_request_id=frame.client_request_id,
                    policy=frame.policy,
                    client_tools=[tool.model_dump() for tool in frame.client_tools],
                )
                self._ack(frame.id, admission_answer(admission))
            case ActionResume():
                result = await commands.resume_action(
                    principal,
                    frame.thread_id,
                    frame.action_id,
                    frame.payload,
                    expected_version=frame.expected_version,
                )
                self._ack(frame.id, version_answer(result))
            case ActionClientResult() | ActionManualResult():
                kind = WaitKind.CLIENT_TOOL
                if isinstance(frame, ActionManualResult):
                    require_trusted(principal)
                    kind = WaitKind.MANUAL_RESULT
                result = await commands.resume_action(
                    principal,
                    frame.thread_id,
                    frame.action_id,
                    {"output": frame.output, "error": frame.error},
                    expected_version=frame.expected_version,
                    kind=kind,
                )
                self._ack(frame.id, version_answer(result))
            case RunStop():
                stopped = await commands.stop_run(principal, frame.thread_id, frame.run_id)
                self._ack(frame.id, stop_answer(stopped))
            case Regenerate():
                rewritten = await commands.regenerate(
                    principal, frame.thread_id, frame.message_id
                )
                self._ack(frame.id, regenerate_answer(rewritten))
            case MessageVisibility():
                rewritten = await commands.set_visibility(
                    principal, frame.thread_id, frame.message_id, frame.visibility
                )
                self._ack(frame.id, version_answer(rewritten))
            case QueueCancel():
                version = await commands.cancel_queued(principal, frame.thread_id, frame.item_id)
                self._ack(frame.id, {"thread_id": frame.thread_id, "version": version})

    # --- subscriptions ------------------------------------------------------------------

    async def _subscribe(self, frame: Subscribe) -> None:
        thread_id = frame.thread_id
        if thread_id in self._listeners:
            versions = await self.store.thread_versions([thread_id])
            version = versions.get(thread_id, 0)
            self._answer(Subscribed(thread_id=thread_id, version=version, id=frame.id).to_bytes())
            return
        if len(self._listeners) >= self.max_subscriptions:
            self._error(
                frame.id,
                "too_many_subscriptions",
                f"at most {self.max_subscriptions} threads per connection",
            )
            return
        # Scope check first (NotFound for a foreign thread): never listen to foreign channels.
        await self.store.get_thread(thread_id, self.principal.scopes)
        listener = ThreadListener(thread_id, self.outbox)
        self._listeners[thread_id] = listener
        try:
            await self.hub.add(thread_id, listener)
            # Read after listening, so no commit between the two can go unnoticed.
            versions = await self.store.thread_versions([thread_id])
            replay = await self.hub.replay(thread_id)
        except BaseException:
            await self._unsubscribe(thread_id)
            raise
        if self.state is SessionState.CLOSED or self._listeners.get(thread_id) is not listener:
            # Closed meanwhile: close() may have run before the hub registration completed.
            await self.hub.remove(thread_id, listener)
            return
        version = versions.get(thread_id, 0)
        self._answer(Subscribed(thread_id=thread_id, version=version, id=frame.id).to_bytes())
        listener.open(version, replay)

    async def _unsubscribe(self, thread_id: str) -> None:
        listener = self._listeners.pop(thread_id, None)
        if listener is None:
            return
        self.outbox.discard_thread(thread_id)
        try:
            await self.hub.remove(thread_id, listener)
        except Exception:
            log.exception("hub.remove(%s) failed", thread_id)

    async def close(self) -> None:
        """Stop listening to every thread. Runs are unaffected: closing a tab stops nothing."""
        if self.state is SessionState.CLOSED:
            return
        self.state = SessionState.CLOSED
        for thread_id in list(self._listeners):
            await self._unsubscribe(thread_id)

    # --- output -------------------------------------------------------------------------

    def _answer(self, data: bytes) -> None:
        self.outbox.put(data, ANSWER, "")

    def _ack(self, frame_id: Any, fields: dict[str, Any]) -> None:
        self._answer(Ack(id=frame_id, **fields).to_bytes())

    def _error(self, frame_id: Any, code: str, message: str, **details: Any) -> None:
        # Details are JSON-ready values; orjson handles enums, dumps the rest by str().
        frame = ErrorFrame(code=code, message=message, id=frame_id, **details)
        self._answer(
            orjson.dumps(
                frame.model_dump(exclude_none=True), default=str, option=orjson.OPT_NON_STR_KEYS
            )
        )
