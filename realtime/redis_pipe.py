"""Concurrent commands of one process coalesced into pipelines: one write and one read per batch.

A worker streaming thousands of runs publishes thousands of chunks a second, each its own bus
operation. Sent one round trip each, every chunk pays a socket write, a read, a pooled
connection's checkout and redis-py's retry wrapper; here every command queued while the
previous batch is on the wire (or in the same event-loop turn) goes out together: the packed
commands in one `writelines`, their replies read back in order. The callers keep their own
commands and replies: an error reply is raised to its caller only, the others are answered.

Order: the commands of one batch run in queue order (one connection), and a caller that waits
for its reply before sending its next command (as every publisher of a thread does) keeps its
own order across batches too, whichever connection carries them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from realtime.bus_support import cancel_and_wait

DEFAULT_SENDERS = 4
# Commands per batch; more queued go with the next batch (or another sender). Larger batches
# made a worker's chunks reach the gateways in bursts of hundreds, which slowed everything else
# the gateways did (bench/live_runs.py at 2 000 runs: messages answered 2x slower with 1 024).
DEFAULT_MAX_BATCH = 64


class PipeClosedError(RedisConnectionError):
    """The pipe was closed before this command was answered."""


@dataclass(slots=True)
class _Call:
    command: bytes
    deadline: float  # loop time: unanswered by then, the caller gets a TimeoutError
    future: asyncio.Future[Any] = field(repr=False)


class CommandPipe:
    """Sends packed commands (`realtime.redis.pack_command`) on `client`'s pooled connections in
    batches: at most `senders` batches in flight (so at most that many connections), each one
    `writelines` of every command queued when its sender took it, then one reply per command.

    Every command has `timeout` from its `send` to its reply, waiting in the queue included (one
    timer per batch, not one per command): a command still queued at its deadline is not sent,
    and a batch that fails on the connection (lost, or silent until the deadline of its oldest
    command) is sent once more on a fresh connection while time is left, as redis-py's retry
    sends a single command once more; what is still unanswered then gets the error. A caller
    that is cancelled while queued sends nothing.
    """

    def __init__(
        self,
        client: Redis,
        *,
        timeout: float,
        senders: int = DEFAULT_SENDERS,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        if senders < 1 or max_batch < 1:
            raise ValueError("senders and max_batch must be at least 1")
        self._client = client
        self._timeout = timeout
        self._senders = senders
        self._max_batch = max_batch
        self._queue: deque[_Call] = deque()
        self._running = 0  # senders started and not yet finished
        self._starting = False  # a sender was started and has not taken its batch yet
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # What was sent, for tests and benchmarks: batches (one write each) and commands.
        self.batches = 0
        self.commands = 0

    async def send(self, command: bytes) -> Any:
        """Send `command` with the next batch; its reply (an error reply raised, e.g.
        `NoScriptError`), or the batch's connection failure."""
        if self._closed:
            raise PipeClosedError("the command pipe is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Call(command, loop.time() + self._timeout, future))
        self._wake()
        return await future

    def _wake(self) -> None:
        """Start a sender when commands wait and fewer than `senders` batches are in flight.
        It takes its batch when it first runs: every command queued until then rides along."""
        if self._starting or self._running >= self._senders or not self._queue:
            return
        self._starting = True
        self._running += 1
        task = asyncio.create_task(self._sender(), name="redis-command-pipe")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Call]:
        batch: list[_Call] = []
        queue = self._queue
        now = asyncio.get_running_loop().time()
        while queue and len(batch) < self._max_batch:
            call = queue.popleft()
            if call.future.done():  # cancelled while queued
                continue
            if call.deadline <= now:
                call.future.set_exception(TimeoutError("queued for Redis past the deadline"))
                continue
            batch.append(call)
        return batch

    async def _sender(self) -> None:
        try:
            self._starting = False
            while batch := self._take():
                self._wake()  # more queued than one batch takes: another sender helps
                await self._run(batch)
        finally:
            self._running -= 1

    async def _run(self, batch: list[_Call]) -> None:
        try:
            try:
                await self._exchange(batch)
            except (RedisConnectionError, RedisTimeoutError, OSError):
                # A pooled connection that died while idle (Redis restarted): once more, as the
                # client's Retry(NoBackoff(), 1) would for one command, while time is left.
                now = asyncio.get_running_loop().time()
                await self._exchange([c for c in batch if not c.future.done() and c.deadline > now])
        except Exception as exc:
            _fail(batch, exc)
        except BaseException:  # cancelled (close): no caller waits forever
            _fail(batch, PipeClosedError("the command pipe was closed"))
            raise

    async def _exchange(self, batch: list[_Call]) -> None:
        if not batch:
            raise TimeoutError("no answer from Redis before the deadline")
        # The oldest command's deadline (the queue is in send order) bounds the batch, the
        # connection's checkout included (a new connection's handshake may go unanswered).
        async with asyncio.timeout_at(batch[0].deadline):
            pool = self._client.connection_pool
            connection = await pool.get_connection()
            answered = 0
            try:
                await connection.send_packed_command([call.command for call in batch], False)
                for call in batch:
                    try:
                        reply: Any = await connection.read_response()
                    except ResponseError as exc:  # an error reply: that command's alone
                        _answer(call.future, exc, error=True)
                    else:
                        _answer(call.future, reply)
                    answered += 1
            except BaseException:
                if answered < len(batch):  # replies left unread: the connection is unusable
                    await connection.disconnect(nowait=True)
                raise
            finally:
                await pool.release(connection)
        self.batches += 1
        self.commands += len(batch)

    async def close(self) -> None:
        """Stop the senders; queued and unanswered callers get `PipeClosedError`."""
        self._closed = True
        for task in list(self._tasks):
            await cancel_and_wait(task)
        _fail(list(self._queue), PipeClosedError("the command pipe was closed"))
        self._queue.clear()


def _answer(future: asyncio.Future[Any], reply: Any, *, error: bool = False) -> None:
    if future.done():
        return
    if error:
        future.set_exception(reply)
    else:
        future.set_result(reply)


def _fail(batch: list[_Call], exc: BaseException) -> None:
    for call in batch:
        if not call.future.done():
            call.future.set_exception(exc)


__all__ = ["CommandPipe", "PipeClosedError"]
