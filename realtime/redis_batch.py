"""Concurrent Lua script calls coalesced into one script call per batch (the limiter's).

A burst of thousands of concurrent callers (a gateway's websockets all connecting or closing at
once) cannot each take a connection of their own: redis-py's pool refuses the 101st, and a
small blocking pool makes the callers queue for a connection, one round trip each. Here callers
queue their call instead, and a few senders send whatever is queued as one EVALSHA of a batch
script that runs every queued call in turn: the burst costs a handful of round trips over at
most `senders` connections, and redis-py packs and parses one command per batch, not per call.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from realtime.bus_support import cancel_and_wait

DEFAULT_MAX_BATCH = 512

# Runs the queued calls in order, each with its own KEYS and ARGV, and returns their replies;
# ARGV is [calls, then per call: operation, key count, argument count, arguments...]. A call
# that raises gives its error as its reply, the others still run (as separate scripts would).
_DISPATCH = """
local replies, k, a = {}, 0, 1
for i = 1, tonumber(ARGV[1]) do
  local op, nk, na = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local keys, args = {}, {}
  for j = 1, nk do keys[j] = KEYS[k + j] end
  for j = 1, na do args[j] = ARGV[a + 3 + j] end
  k, a = k + nk, a + 3 + na
  local ok, reply = pcall(OPERATIONS[op], keys, args)
  if not ok then
    if type(reply) == 'table' and reply.err then reply = reply.err end
    reply = redis.error_reply(tostring(reply))
  elseif reply == nil then
    reply = false
  end
  replies[i] = reply
end
return replies
"""


@dataclass(frozen=True)
class Operation:
    """A Lua script body registered with a `Batcher`: it reads KEYS and ARGV and returns a reply
    (not nil), as it would as a script of its own."""

    index: int
    body: str


@dataclass
class _Call:
    operation: Operation
    keys: Sequence[str]
    args: Sequence[Any]
    future: asyncio.Future[Any]


class BatchClosedError(ConnectionError):
    """The batcher was closed before this call was answered."""


class Batcher:
    """Runs the concurrent script calls of one client in batches: one EVALSHA each.

    A caller queues its call and waits. A sender takes what is queued (at most `max_batch`
    calls) and sends it as one batch script call (on a cluster: one per hash slot of the calls,
    pipelined); it answers each caller with its own reply, or raises its own error. What arrives
    while a batch is out queues for the next one or for another sender. At most `senders`
    batches are in flight, so the client holds at most that many connections (to each node of a
    cluster) however many callers wait.

    A batch is atomic and runs its calls in queue order, so every call counts exactly as it
    would as a script of its own. A batch that fails or takes longer than `timeout` (connection
    lost, Redis stalled) raises that error to each of its callers, who decide what to do
    instead; a caller may also have waited for the batches queued before its own (under a
    stalled Redis, `timeout` for each round of `senders` batches ahead). When Redis has
    forgotten the script (restarted, SCRIPT FLUSH) it is loaded and the batch sent once more.
    """

    def __init__(
        self,
        client: Any,
        *,
        timeout: float,
        senders: int,
        cluster: bool = False,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._senders = senders
        self._cluster = cluster
        self._max_batch = max_batch
        self._queue: deque[_Call] = deque()
        self._running = 0  # senders started and not yet finished
        self._starting = False  # a sender was started but has not taken its batch yet
        self._tasks: set[asyncio.Task[None]] = set()
        self._operations: list[Operation] = []
        self._source = ""
        self._sha = ""
        self._loaded = False  # the slot map (cluster) and the script are loaded
        self._load_lock = asyncio.Lock()
        self._closed = False
        # What was sent, for tests and benchmarks.
        self.batches = 0
        self.calls = 0
        self.scripts = 0  # EVALSHA sent (a batch on a cluster sends one per hash slot)
        self.peak_senders = 0

    def operation(self, body: str) -> Operation:
        """Register the Lua script `body`; call it with `call`. Register before the first call."""
        operation = Operation(len(self._operations) + 1, body)
        self._operations.append(operation)
        functions = "".join(
            f"OPERATIONS[{op.index}] = function(KEYS, ARGV)\n{op.body}\nend\n"
            for op in self._operations
        )
        self._source = f"local OPERATIONS = {{}}\n{functions}{_DISPATCH}"
        self._sha = hashlib.sha1(self._source.encode()).hexdigest()
        self._loaded = False
        return operation

    async def call(self, operation: Operation, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run `operation` on `keys` and `args` in the next batch; its reply (its error, raised).
        On a cluster, the keys of one call must be of one hash slot."""
        if self._closed:
            raise BatchClosedError("the batcher is closed")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(_Call(operation, keys, args, future))
        self._wake()
        return await future

    async def call_many(
        self, operation: Operation, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Exception | None]:
        """`call(operation, keys, args)` for every (keys, args) of `calls`, all queued at once
        (so they ride in as few batches as `max_batch` allows); each call's error, or None for
        a reply, in order."""
        if self._closed:
            raise BatchClosedError("the batcher is closed")
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = []
        for keys, args in calls:
            futures.append(loop.create_future())
            self._queue.append(_Call(operation, keys, args, futures[-1]))
        self._wake()
        replies = await asyncio.gather(*futures, return_exceptions=True)
        return [reply if isinstance(reply, Exception) else None for reply in replies]

    def _wake(self) -> None:
        """Start a sender when calls wait and fewer than `senders` batches are in flight.
        Started lazily, it takes its batch when it first runs: every caller queued until then
        rides along."""
        if self._starting or self._running >= self._senders or not self._queue:
            return
        self._starting = True
        self._running += 1
        self.peak_senders = max(self.peak_senders, self._running)
        task = asyncio.create_task(self._send(), name="redis-batch-sender")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Call]:
        batch: list[_Call] = []
        while self._queue and len(batch) < self._max_batch:
            call = self._queue.popleft()
            if not call.future.done():  # a caller cancelled while queued sends nothing
                batch.append(call)
        return batch

    async def _send(self) -> None:
        try:
            self._starting = False
            while batch := self._take():
                self._wake()  # more than one batch queued: another sender takes the rest
                await self._run(batch)
        finally:
            self._running -= 1

    async def _run(self, batch: list[_Call]) -> None:
        try:
            await self._load()  # once; bounded by the client's socket timeouts
            async with asyncio.timeout(self._timeout):
                replies = await self._execute(batch)
        except Exception as exc:  # the whole batch failed: each caller gets the error
            self._fail(batch, exc)
            return
        except BaseException:  # cancelled (close): no caller waits forever
            self._fail(batch, BatchClosedError("the batcher was closed"))
            raise
        for call, reply in zip(batch, replies, strict=True):
            if call.future.done():
                continue
            if isinstance(reply, Exception):
                call.future.set_exception(reply)
            else:
                call.future.set_result(reply)

    @staticmethod
    def _fail(batch: list[_Call], exc: BaseException) -> None:
        for call in batch:
            if not call.future.done():
                call.future.set_exception(exc)

    async def _load(self) -> None:
        """Before the first batch: a cluster's slot map (see redis_urls.initialize), the script."""
        if self._loaded:
            return
        from realtime.redis_urls import initialize

        async with self._load_lock:
            if not self._loaded:
                await initialize(self._client)
                await self._client.script_load(self._source)  # on a cluster: every primary
                self._loaded = True

    def _groups(self, batch: list[_Call]) -> list[list[_Call]]:
        """The calls of one script call each: all of them, or on a cluster those of one slot."""
        if not self._cluster:
            return [batch]
        from redis.crc import key_slot

        slots: dict[int, list[_Call]] = {}
        for call in batch:
            slot = key_slot(call.keys[0].encode()) if call.keys else 0
            slots.setdefault(slot, []).append(call)
        return list(slots.values())

    async def _execute(self, batch: list[_Call]) -> list[Any]:
        """Each call's reply, in order; a script Redis forgot is loaded and sent once more."""
        groups = self._groups(batch)
        results = await self._pipeline(groups)
        if any(isinstance(result, NoScriptError) for result in results):
            await self._client.script_load(self._source)
            results = await self._pipeline(groups)
        replies: dict[int, Any] = {}
        for group, result in zip(groups, results, strict=True):
            if isinstance(result, Exception):
                result = [result] * len(group)
            elif not isinstance(result, list) or len(result) != len(group):
                raise ValueError(f"a batch of {len(group)} calls got {result!r}")
            replies.update((id(call), reply) for call, reply in zip(group, result, strict=True))
        self.batches += 1
        self.calls += len(batch)
        return [replies[id(call)] for call in batch]  # in the callers' order, not the slots'

    async def _pipeline(self, groups: list[list[_Call]]) -> list[Any]:
        """One EVALSHA per group, pipelined: each group's reply list or error."""
        pipe = self._client.pipeline(transaction=False)
        for group in groups:
            keys: list[Any] = []
            args: list[Any] = [len(group)]
            for call in group:
                keys.extend(call.keys)
                args.extend((call.operation.index, len(call.keys), len(call.args)))
                args.extend(call.args)
            pipe.execute_command("EVALSHA", self._sha, len(keys), *keys, *args)
        self.scripts += len(groups)
        return list(await pipe.execute(raise_on_error=False))

    async def close(self) -> None:
        """Stop the senders; queued and unanswered callers get `BatchClosedError`."""
        self._closed = True
        for task in list(self._tasks):
            await cancel_and_wait(task)
        self._fail(list(self._queue), BatchClosedError("the batcher was closed"))
        self._queue.clear()


__all__ = ["BatchClosedError", "Batcher", "Operation"]
