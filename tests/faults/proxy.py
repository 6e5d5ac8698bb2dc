"""A TCP proxy for fault injection: cut, refuse or stall connections, or cut one at a COMMIT."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

_CHUNK = 65536
ANSWER_WAIT = 2.0  # a forwarded trap's longest wait for the server's answer (seconds)
_HELLO = 1024  # the client's first bytes kept: an SSL request, then the startup message


@dataclass(eq=False)
class _Link:
    """One proxied connection: client socket ⇄ upstream socket, two pumping tasks."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # The trap's `after` marker was seen on this connection since its last `marker` (and,
    # for `cut_commit_after`, since its last BEGIN): what matched it.
    primed: bytes | None = None
    # The server's replies are dropped from now on (the client must not learn the outcome).
    muted: bool = False
    # The server answered after the trap muted the connection (its COMMIT's outcome).
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    # The client's first bytes: its startup message (user, database, application_name).
    hello: bytes = b""

    def close(self) -> None:
        for writer in (self.client, self.upstream):
            with contextlib.suppress(Exception):
                # abort(): an RST now, not a polite FIN after buffered data is flushed.
                writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Listens on 127.0.0.1:`port` (0: any) and forwards to `target_host:target_port`.

    Faults, all counted in `faults`:
    - `cut_all()`: abort every open connection;
    - `outage(seconds)`: cut everything and refuse (accept-then-abort) new connections;
    - `stall(seconds)`: hold every byte in both directions, then let it through;
    - `delay(seconds, latency)`: forward every chunk `latency` late, for `seconds`;
    - `cut_at(marker, forward=...)`: arm a one-shot trap that aborts the connection whose
      client next sends `marker` (e.g. b"COMMIT"), after forwarding it to the server
      (`forward=True`: the outcome is unknown to the client but committed: the cut waits for
      the server's answer, which the client never gets) or without it;
    - `cut_commit_after(pattern, forward=..., origin=...)`: the same at the COMMIT of the first
      transaction whose client sends bytes matching `pattern` (a marker of one kind of write,
      e.g. the text a send inserts), on a connection whose startup message names `origin` (an
      application_name); `matched` then says what matched.
    """

    def __init__(self, target_host: str, target_port: int, port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = port
        self.faults = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._refusing = False
        self._resume = asyncio.Event()
        self._resume.set()
        self._latency = 0.0
        self._trap: tuple[bytes, bool] | None = None
        self._skip = 0
        self._after: bytes | re.Pattern[bytes] | None = None
        self._unprime: bytes | None = None
        self._origin = b""
        self.trap_fired = asyncio.Event()
        self.matched = b""

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.close()
        # Let the aborted transports release their sockets before the loop goes away.
        await asyncio.sleep(0.05)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    # --- faults --------------------------------------------------------------------------

    def cut_all(self) -> int:
        links = list(self._links)
        for link in links:
            link.close()
        self._links.clear()
        self.faults += 1
        return len(links)

    async def outage(self, seconds: float) -> None:
        self._refusing = True
        self.cut_all()
        try:
            await asyncio.sleep(seconds)
        finally:
            self._refusing = False

    async def stall(self, seconds: float) -> None:
        self.faults += 1
        self._resume.clear()
        try:
            await asyncio.sleep(seconds)
        finally:
            self._resume.set()

    async def delay(self, seconds: float, latency: float) -> None:
        """Hold every chunk in both directions `latency` seconds before forwarding it, for
        `seconds` (a slow network: everything arrives, late)."""
        self.faults += 1
        self._latency = latency
        try:
            await asyncio.sleep(seconds)
        finally:
            self._latency = 0.0

    def cut_at(
        self, marker: bytes, *, forward: bool, skip: int = 0, after: bytes | None = None
    ) -> None:
        """Arm the trap for the (`skip`+1)-th message containing `marker` from now on; with
        `after`, only on a connection that sent `after` before (e.g. the BEGIN of a write
        transaction, so that read-only transactions' COMMITs pass)."""
        self._arm(marker, forward, skip, after, None)

    def cut_commit_after(
        self, pattern: re.Pattern[bytes], *, forward: bool, origin: bytes = b""
    ) -> None:
        """Arm the trap for the COMMIT of the first transaction whose client sends bytes
        matching `pattern` before it, on a connection whose startup message holds `origin`: a
        BEGIN on a connection forgets a match it sent earlier (that transaction ended without
        COMMIT). Postgres's simple and extended protocols both send a statement's parameters as
        they are, so a value the write binds (not only its SQL text, which a prepared statement
        sends once) can be the pattern."""
        self._arm(b"COMMIT", forward, 0, pattern, b"BEGIN")
        self._origin = origin

    def _arm(
        self,
        marker: bytes,
        forward: bool,
        skip: int,
        after: bytes | re.Pattern[bytes] | None,
        unprime: bytes | None,
    ) -> None:
        self.trap_fired.clear()
        self.matched = b""
        if unprime is not None or self._unprime is not None:  # another kind of priming
            for link in self._links:
                link.primed = None
        self._trap = (marker, forward)
        self._after = after
        self._unprime = unprime
        self._origin = b""
        self._skip = skip

    def disarm(self) -> None:
        self._trap = None

    def _hit(self, link: _Link, data: bytes) -> bool:
        """Whether `data`, from `link`'s client, springs the armed trap (priming links)."""
        trap, after = self._trap, self._after
        hit = trap is not None and trap[0] in data
        if after is None:
            return hit
        if isinstance(after, re.Pattern):
            match = after.search(data) if self._origin in link.hello else None
            found = None if match is None else match.group()
        else:
            found = after if after in data else None
        if found is not None:
            link.primed = found
        elif self._unprime is not None and self._unprime in data:
            link.primed = None
        if hit and link.primed is None:
            hit = False
        if hit:
            self.matched = link.primed or b""
            link.primed = None
        return hit

    # --- pumping -------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, link, upstream=True)),
            asyncio.create_task(self._pump(up_reader, writer, link, upstream=False)),
        ]
        await asyncio.gather(*link.tasks, return_exceptions=True)
        self._links.discard(link)
        link.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        link: _Link,
        *,
        upstream: bool,
    ) -> None:
        try:
            while data := await reader.read(_CHUNK):
                await self._resume.wait()
                if self._latency:
                    await asyncio.sleep(self._latency)
                if upstream and len(link.hello) < _HELLO:
                    link.hello += data[:_HELLO]
                trap = self._trap
                hit = upstream and self._hit(link, data)
                if hit and self._skip > 0:
                    self._skip -= 1
                elif hit and trap is not None:
                    self._trap = None
                    link.muted = True
                    if trap[1]:
                        writer.write(data)
                        await writer.drain()
                        # Cut once the server answered (it did the COMMIT: a cut before it
                        # read the COMMIT, on a loaded box, would roll back instead), or
                        # after ANSWER_WAIT seconds without an answer.
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(link.answered.wait(), ANSWER_WAIT)
                    self.faults += 1
                    self.trap_fired.set()
                    link.close()
                    return
                if link.muted:
                    link.answered.set()  # the server's answer, which the client never gets
                    continue
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            link.close()


# What the `make_proxy` fixture gives: a FaultProxy to the test's database per call.
ProxyFactory = Callable[[], FaultProxy]
