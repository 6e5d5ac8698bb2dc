"""The Python client across a server restart: a real `threadline serve` process is killed while
the client calls and started again on the same port. Idempotent calls (a GET, a send carrying
its `client_request_id`) succeed once it is back; a call that is not safe to repeat is tried
once and raises the SDK's `ConnectionFailed`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e import harness
from threadline_client import ConnectionFailed, ThreadlineClient

# Hang guards only (a loaded 2-core box restarts a server slowly); nothing asserts on time.
GUARD = 120.0
# Enough attempts to outlast a restart: backoff doubles from 0.2 s to at most 2 s a try.
ATTEMPTS = 80


@dataclass
class Server:
    """The one server of this module, which tests kill and start again on its port."""

    handle: harness.ServerHandle
    log_dir: Path
    token: str

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, connections reset mid-flight."""
        self.handle.process.kill()
        self.handle.process.wait(timeout=harness.STOP_TIMEOUT)
        self.handle.stop()

    def restart(self) -> None:
        self.handle = harness.start("all", self.handle.env, self.handle.port, log_dir=self.log_dir)


@dataclass
class KillingTransport(httpx.AsyncBaseTransport):
    """The client's real transport, which kills the server just before the first request it
    forwards once `armed`, and records what each attempt met (`ok` or the error's type)."""

    server: Server
    inner: httpx.AsyncHTTPTransport = field(default_factory=httpx.AsyncHTTPTransport)
    armed: bool = False
    attempts: list[str] = field(default_factory=list)
    failed: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.armed:
            self.armed = False
            await asyncio.to_thread(self.server.kill)
        try:
            response = await self.inner.handle_async_request(request)
        except httpx.TransportError as exc:
            self.attempts.append(type(exc).__name__)
            self.failed.set()
            raise
        self.attempts.append("ok")
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log_dir = tmp_path_factory.mktemp("restart")
    with harness.start("all", log_dir=log_dir) as handle:
        running = Server(handle, log_dir, handle.token("alpha", "user", "alice"))
        try:
            yield running
        finally:
            running.handle.stop()


def retried(attempts: list[str]) -> bool:
    """One call's attempts: failed at first, then failures until the last one succeeded."""
    return len(attempts) >= 2 and attempts[-1] == "ok" and "ok" not in attempts[:-1]


@contextlib.asynccontextmanager
async def client(server: Server) -> AsyncIterator[tuple[ThreadlineClient, KillingTransport]]:
    transport = KillingTransport(server)
    async with ThreadlineClient(
        server.handle.url, server.token, transport=transport, attempts=ATTEMPTS
    ) as tl:
        yield tl, transport


async def across_restart(server: Server, transport: KillingTransport, call: Awaitable[Any]) -> Any:
    """Run `call` with the server killed under its first attempt, and started again once
    that attempt failed; the call's answer."""
    transport.armed = True
    task = asyncio.ensure_future(call)
    try:
        await asyncio.wait_for(transport.failed.wait(), GUARD)
        await asyncio.to_thread(server.restart)
        return await asyncio.wait_for(task, GUARD)
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


Call = Callable[[ThreadlineClient, str], Awaitable[Any]]


async def _snapshot(tl: ThreadlineClient, thread_id: str) -> Any:
    return (await tl.snapshot(thread_id)).thread.id


async def _list(tl: ThreadlineClient, thread_id: str) -> Any:
    page = await tl.list_threads(metadata={"restart": thread_id})
    return [t.id for t in page.threads]


@pytest.mark.parametrize(
    ("call", "expected"),
    [(_snapshot, lambda thread_id: thread_id), (_list, lambda thread_id: [thread_id])],
    ids=["snapshot", "list_threads"],
)
async def test_an_idempotent_read_succeeds_once_the_server_is_back(
    server: Server, call: Call, expected: Callable[[str], Any]
) -> None:
    async with client(server) as (tl, transport):
        created = await tl.create_thread("restart", metadata={"restart": "x"})
        thread_id = created.thread.id
        await tl.update_metadata(thread_id, {"restart": thread_id})
        answer = await across_restart(server, transport, call(tl, thread_id))
    assert answer == expected(thread_id)
    assert retried(transport.attempts[2:]), transport.attempts


async def test_a_send_with_its_request_id_is_retried_and_commits_once(server: Server) -> None:
    async with client(server) as (tl, transport):
        thread_id = (await tl.create_thread("restart send")).thread.id
        sent = await across_restart(
            server, transport, tl.send(thread_id, "across a restart", client_request_id="r-1")
        )
        again = await tl.send(thread_id, "across a restart", client_request_id="r-1")
        snapshot = await tl.snapshot(thread_id)
    assert retried(transport.attempts[1:-2]), transport.attempts
    assert sent.message_id is not None and not sent.duplicate
    assert again.duplicate and again.message_id == sent.message_id
    users = [m for m in snapshot.messages if m.role == "user"]
    assert [m.text for m in users] == ["across a restart"]


async def test_a_call_unsafe_to_repeat_is_tried_once_and_raises(server: Server) -> None:
    async with client(server) as (tl, transport):
        before = await tl.list_threads(limit=500)
        transport.armed = True
        with pytest.raises(ConnectionFailed) as raised:
            await tl.create_thread("never twice")
        await asyncio.to_thread(server.restart)
        after = await tl.list_threads(limit=500)
    assert raised.value.status == 0 and isinstance(raised.value.__cause__, httpx.TransportError)
    # The two lists went through; create_thread was tried once, and failed.
    assert len(transport.attempts) == 3 and transport.attempts.count("ok") == 2
    assert transport.attempts[1] != "ok", transport.attempts
    assert [t.id for t in after.threads] == [t.id for t in before.threads]
