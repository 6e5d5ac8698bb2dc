"""The command table's machinery: what a command is (`Command`, `Http`), who runs it (`Caller`)
and how one or several run (`charge_together`, `admit`, `run_together`); commands.py holds
the table itself."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

from realtime.bus_metrics import safe_add
from runtime.authorization import ThreadMatch, ThreadResource
from runtime.domain import Origin, Principal, Role
from runtime.errors import Forbidden, InvalidInput, QuotaExceeded
from runtime.service.acts import ActPart, act
from runtime.service.thread_service import ThreadService
from runtime.storage.store import ActResult
from server.auth import Grant
from server.live.quotas import Limiter
from server.live.revocation import TokenRevoker
from server.live.snapshot_cache import SnapshotCache
from server.live.snapshot_deltas import SnapshotDeltas
from server.protocol.authorizer import Authorizer
from server.protocol.inputs import Input
from server.tracing import QUOTA_REFUSALS
from threadline_wire.frames import Ack, ServerFrame

I = TypeVar("I", bound=Input)  # noqa: E741 - the input model, as in the table's columns
R = TypeVar("R")
PATH_PARAM = re.compile(r"{(\w+)}")


WS_ONLY = "acts on the websocket connection itself"
# Reads stay on HTTP: live frames only say *when* to refetch; the snapshot is the truth.
READ = "a read: clients fetch state over HTTP, the websocket tells them when to refetch"


def query_limit(query: Mapping[str, str]) -> dict[str, Any]:
    """A list's `?limit=`: 1 to 500, 100 when absent."""
    raw = query.get("limit", "100")
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 500:
        raise InvalidInput("query parameter 'limit' must be an integer from 1 to 500")
    return {"limit": int(raw)}


class Connection(Protocol):
    """The websocket session, for the commands that act on the connection itself."""

    async def subscribe(self, thread_id: str, frame_id: Any, deltas: bool = False) -> None: ...
    async def unsubscribe(self, thread_id: str) -> None: ...
    async def subscribe_actions(
        self,
        scope: str | None,
        assigned: bool = False,
        allowed: tuple[ThreadMatch, ...] | None = None,
    ) -> list[str]: ...
    async def unsubscribe_actions(self, scope: str | None) -> list[str]: ...
    async def update_presence(self, thread_id: str, changes: dict[str, Any]) -> None: ...
    async def refresh_token(self, token: str) -> Grant: ...


@dataclass(frozen=True)
class Caller:
    """Who runs a command, and through what: the service, and over a websocket its session."""

    principal: Principal
    service: ThreadService
    connection: Connection | None = None
    frame_id: Any = None
    # Quotas of the deployment (None: unlimited, as in unit tests) and the caller's token key.
    limiter: Limiter | None = None
    token_id: str = ""
    revoker: TokenRevoker | None = None
    # Where the command came from (transport, client address, user agent): the audit log's.
    origin: Origin | None = None
    # The authorization hook's answer (server/protocol/authorizer.py): `admitted` once it
    # allowed this command, `narrow` the threads a list may show (None: every one in scope).
    admitted: bool = False
    narrow: tuple[ThreadMatch, ...] | None = None
    # The gateway's snapshot cache (None: every snapshot is read from storage).
    snapshots: SnapshotCache | None = None
    # The gateway's delta builder: told of the snapshots it answers without a read.
    deltas: SnapshotDeltas | None = None

    def tokens(self) -> TokenRevoker:
        if self.revoker is None:
            raise RuntimeError("token administration is not configured")
        return self.revoker

    def session(self) -> Connection:
        if self.connection is None:
            raise RuntimeError("a connection command ran outside a websocket")
        return self.connection


@dataclass(frozen=True)
class Http:
    """How a command is offered over HTTP. Path parameters name fields of the input model."""

    method: str
    path: str
    route: str  # the route's name: stable, tests address routes by it
    status: int = 200
    body: bool = True  # False: the route does not read its body at all
    query: Callable[[Mapping[str, str]], dict[str, Any]] | None = None
    # A conditional read: the entity tag of a result as the caller sees it. The route answers
    # with an `ETag` header, and `304 Not Modified` (no body) to an `If-None-Match` naming it.
    etag: Callable[[Principal, Any], str] | None = None

    @property
    def path_fields(self) -> tuple[str, ...]:
        return tuple(PATH_PARAM.findall(self.path))


@dataclass(frozen=True)
class Command(Generic[I, R]):
    """One command: its name, input, service call, answer and transports.

    `name` is the websocket frame type (a dotted name for HTTP-only commands too). `reply` is
    the server frame answering it over the websocket (None: not offered there), `http` its
    route (None: not offered there); `note` says why a transport is missing. `authorize` is a
    role rule of the service, asked before the input is read so a refusal never depends on it.
    `limited` commands draw from the caller's rate limits; reads, keepalives and subscriptions
    (bounded per connection) do not, so refetching snapshots never eats a client's budget.
    """

    name: str
    input: type[I]
    call: Callable[[Caller, I], Awaitable[R]]
    answer: Callable[[I, R], dict[str, Any] | None]
    answer_doc: str
    reply: type[ServerFrame] | None = Ack
    http: Http | None = None
    authorize: Callable[[Principal], None] | None = None
    note: str = ""
    limited: bool = True
    # The event-stream routes (AG-UI, AI SDK) that run it, for a command offered only there.
    sse: str = ""
    # What `call` checks before its effect, with none: run first for every command of a
    # request made of several, so one refused command leaves all of them undone.
    precheck: Callable[[Caller, I], Awaitable[None]] | None = None
    # The command as a part of an act (`run_together`): None for a command no act may hold.
    part: Callable[[I], ActPart] | None = None

    def parse(self, caller: Caller, fields: Mapping[str, Any]) -> I:
        """Authorize the caller, then validate `fields` (path, query, body or frame, or what an
        adapter translated) into the input: the same refusals on every transport."""
        if self.authorize is not None:
            self.authorize(caller.principal)
        try:
            return self.input.model_validate(dict(fields))
        except RecursionError as exc:
            # Validating JSON nested this deep exhausts Python's stack before the depth check.
            raise InvalidInput("the input is nested too deeply") from exc

    async def result(self, caller: Caller, data: I) -> R:
        """Check limits and call the service: what it returned, before the answer's shaping."""
        data.check()  # size limits first: cheap, and a refused input costs no rate budget
        caller = await admit(caller, self, data)
        try:
            if self.limited and caller.limiter is not None:
                await caller.limiter.command(caller.principal, caller.token_id)
            return await self.call(caller, data)
        except QuotaExceeded as exc:
            safe_add(QUOTA_REFUSALS, 1, {"code": exc.code})
            raise

    async def run(self, caller: Caller, data: I) -> dict[str, Any] | None:
        """Check limits, call the service, shape the answer (None: the call answered itself)."""
        return self.answer(data, await self.result(caller, data))


Step = tuple[Command[Any, Any], Input]


async def charge_together(caller: Caller, steps: Sequence[Step]) -> Caller:
    """Check and charge every step of one request before any runs (an adapter's request that
    is several commands is refused whole or not at all); the caller to run them with, whose
    budget is spent already."""
    pending: dict[str, ThreadResource] = {}
    for command, data in steps:
        data.check()
        await admit(caller, command, data, pending)
        if command.precheck is not None:
            await command.precheck(caller, data)
    if caller.limiter is not None:
        try:
            for command, _ in steps:
                if command.limited:
                    await caller.limiter.command(caller.principal, caller.token_id)
        except QuotaExceeded as exc:
            safe_add(QUOTA_REFUSALS, 1, {"code": exc.code})
            raise
    return replace(caller, limiter=None, admitted=True)


async def admit(
    caller: Caller,
    command: Command[Any, Any],
    data: Input,
    pending: dict[str, ThreadResource] | None = None,
) -> Caller:
    """Ask the deployment's authorization hook about this command, once, before any effect:
    the caller to run it with (its `narrow` set for a list), or `ForbiddenByPolicy`."""
    hook = caller.service.authorize_hook
    if hook is None or caller.admitted:
        return caller
    authorizer = Authorizer(hook, caller.service.store)
    narrow = await authorizer.admit(caller.principal, command.name, data, caller.origin, pending)
    return replace(caller, admitted=True, narrow=narrow)


async def run_together(charged: Caller, thread_id: str, steps: Sequence[Step]) -> ActResult:
    """Run the steps `charge_together` checked and charged as one act on `thread_id`: one
    store transaction, so a refusal only the store can make (a lost race, a full queue) leaves
    every step undone, not only the ones after it."""
    parts: list[ActPart] = []
    for command, data in steps:
        if command.part is None or getattr(data, "thread_id", None) != thread_id:
            raise RuntimeError(f"{command.name} cannot be part of an act on {thread_id}")
        parts.append(command.part(data))
    return await act(charged.service, charged.principal, thread_id, parts, charged.origin)


def require_admin(principal: Principal) -> None:
    if principal.role is not Role.ADMIN:
        raise Forbidden(f"role {principal.role} may not do this; admin required")
