"""Worker: finds runnable runs, takes their leases, runs episodes, heartbeats, obeys stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from realtime.bus import Bus
from runtime.agent import Agent
from runtime.compose import compose_lifecycle
from runtime.engine.control import CONTROL_CHANNEL, StopEnvelope, WakeupEnvelope, decode_control
from runtime.engine.episode import Episode
from runtime.engine.message_cache import HistoryCache
from runtime.engine.publisher import DEFAULT_REPLAY_MAX_BYTES, Publisher
from runtime.engine.renewals import LeaseRenewals, beat_delay
from runtime.errors import NotFound
from runtime.mcp.config import MCPHttp, MCPStdio
from runtime.storage.scope_cache import ScopeCache
from runtime.storage.store import EngineStore, RunStart

if TYPE_CHECKING:
    from runtime.mcp.pool import MCPPool

log = logging.getLogger(__name__)
# Request trace contexts kept for runs not started yet (`Worker._remember_link`).
MAX_LINKS = 1024


def _stored_link(start: RunStart) -> str | None:
    """The trace context stored with the run, where the lease request started it and read it."""
    return None if start.started is None else start.started.run.traceparent


class Worker:
    """Executes runs. Wakeups arrive on the bus; a periodic poll of storage is the fallback, so
    a lost wakeup delays a run by at most `poll_interval` and never strands it."""

    def __init__(
        self,
        store: EngineStore,
        bus: Bus,
        agent: Agent,
        *,
        owner: str | None = None,
        lease_ttl: float = 15.0,
        poll_interval: float = 1.0,
        max_concurrent_runs: int = 16,
        replay_max_bytes: int = DEFAULT_REPLAY_MAX_BYTES,
        mcp_servers: Sequence[MCPStdio | MCPHttp] = (),
    ) -> None:
        self.store = store
        self.bus = bus
        # Announce commits per scope too (the action inbox).
        scopes = ScopeCache(store)
        self.publisher = Publisher(
            bus,
            replay_max_bytes=replay_max_bytes,
            scope_of=scopes.scope_of,
            remember_scope=scopes.remember,
        )
        self.agent = agent
        self.lifecycle = compose_lifecycle(agent.lifecycle)
        self.owner = owner or f"worker-{uuid.uuid4().hex[:10]}"
        self.lease_ttl = lease_ttl
        # Every episode's renewals, batched into one storage call per beat (renewals.py).
        self._renewals = LeaseRenewals(store, lease_ttl)
        self.poll_interval = poll_interval
        self.max_concurrent_runs = max_concurrent_runs
        self.episodes: dict[str, Episode] = {}
        # Runs whose lease request is in flight (`_take`), each with whether a stop named it
        # meanwhile: on Postgres the request starts the episode, so a stop committed after it
        # is seen by no read of the episode, only by its signal.
        self._starting: dict[str, bool] = {}
        # Parsed messages of the threads this worker runs (validated by a tail read each time).
        self.history = HistoryCache()
        self._wake = asyncio.Event()
        # Runs named by wakeups since the last claim (with their thread, when the wakeup said
        # it), taken by their id without a poll while nothing is left waiting for a slot
        # (`_claim_named`); anything else wakes a poll.
        self._named: list[tuple[str, str | None]] = []
        self._poll_due = True
        # Whether the last poll may have left runnable runs for lack of a free slot: an
        # episode that ends then polls again at once.
        self._backlog = False
        self._tasks: set[asyncio.Task[None]] = set()
        # Trace contexts of the requests that started or resumed runs (wakeups), by run id.
        self._links: dict[str, str] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._closing = False
        # The agent's MCP servers and the deployment's: one session each for all the runs of
        # this worker, opened with it and closed after its episodes (runtime/mcp/pool.py).
        self.mcp: MCPPool | None = None
        servers = [*agent.mcp_servers, *mcp_servers]
        if servers:
            from runtime.mcp.pool import MCPPool  # the MCP SDK loads only when it is used

            self.mcp = MCPPool(servers, reserved=[t.name for t in agent.tools])

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        if self.mcp is not None:
            self.mcp.start()
        self._loops = [
            asyncio.create_task(self._control_loop(), name="worker-control"),
            asyncio.create_task(self._poll_loop(), name="worker-poll"),
        ]

    async def stop(self) -> None:
        """Stop taking runs, then abandon running episodes without writing: their leases
        expire and another worker takes them over (only an explicit stop cancels a run)."""
        self._closing = True
        for task in self._loops:
            task.cancel()
        for episode in self.episodes.values():
            episode.lose_lease()
        pending = [*self._loops, *self._tasks]
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._renewals.close()
        await self.publisher.close()
        if self.mcp is not None:
            await self.mcp.aclose()  # after the episodes: none is left calling a tool

    def wake(self) -> None:
        self._poll_due = True
        self._wake.set()

    # --- loops ----------------------------------------------------------------------------

    async def _control_loop(self) -> None:
        while not self._closing:
            try:
                async with self.bus.subscribe(CONTROL_CHANNEL) as subscription:
                    async for data in subscription:
                        self._on_control(data)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("worker control subscription failed; polling meanwhile", exc_info=True)
            await asyncio.sleep(self.poll_interval)

    def _on_control(self, data: bytes) -> None:
        try:
            envelope = decode_control(data)
        except Exception:
            log.warning("ignoring malformed control message")
            return
        if isinstance(envelope, WakeupEnvelope):
            if envelope.run_id is None:
                self.wake()
            else:
                if envelope.traceparent is not None:
                    self._remember_link(envelope.run_id, envelope.traceparent)
                self._named.append((envelope.run_id, envelope.thread_id))
                self._wake.set()
        elif isinstance(envelope, StopEnvelope):
            episode = self.episodes.get(envelope.run_id)
            if episode is not None:
                episode.stop_requested.set()
            elif envelope.run_id in self._starting:
                self._starting[envelope.run_id] = True
            else:
                self.wake()  # a waiting run with a stop request needs a worker

    def _remember_link(self, run_id: str, traceparent: str) -> None:
        """Keep a run's request trace context for its episode; bounded, oldest dropped (a run
        another worker took never comes here to collect it)."""
        self._links[run_id] = traceparent
        while len(self._links) > MAX_LINKS:
            self._links.pop(next(iter(self._links)))

    async def _poll_loop(self) -> None:
        while not self._closing:
            self._wake.clear()
            named, self._named = self._named, []
            poll, self._poll_due = self._poll_due or not named or self._backlog, False
            try:
                if poll:
                    await self._claim()
                else:
                    await self._claim_named(named)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("worker poll failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_interval)
            if not self._wake.is_set():
                self._poll_due = True  # the periodic poll: lost wakeups strand nothing

    async def _claim(self) -> None:
        free = self.max_concurrent_runs - len(self.episodes)
        self._backlog = free <= 0
        if free <= 0:
            return
        runs = await self.store.find_runnable_runs(limit=free)
        self._backlog = len(runs) >= free
        for run in runs:
            await self._take(run.id, run.thread_id, run.traceparent)

    async def _claim_named(self, named: list[tuple[str, str | None]]) -> None:
        """The runs wakeups named, by id: one lease request each, no poll. Only while no run
        waits for a slot (the poll's order is then moot: it would take them all); a run that
        is not runnable, or that another worker took, gets no lease (`start_run`)."""
        threads: dict[str, str | None] = {}
        for run_id, thread_id in named:
            threads[run_id] = threads.get(run_id) or thread_id
        for run_id, thread_id in threads.items():
            if len(self.episodes) >= self.max_concurrent_runs:
                self.wake()  # the rest wait for a slot, in the poll's order
                return
            with contextlib.suppress(NotFound):  # e.g. a thread deleted meanwhile
                await self._take(run_id, thread_id)

    async def _take(
        self, run_id: str, thread_id: str | None = None, traceparent: str | None = None
    ) -> None:
        """Lease `run_id` and run an episode of it, unless running it already or closing. With
        the run's `thread_id`, the store may read the thread's messages with the run's start,
        from the tail this worker has cached (`Store.start_run`). The episode links to the
        request that started (or resumed) the run: its wakeup's trace context, else the one
        stored with the run (`traceparent`, as the poll read it, or as the start read it)."""
        if run_id in self.episodes or run_id in self._starting or self._closing:
            return
        # Before the request: the lease cannot expire earlier than this instant plus the TTL.
        sent = asyncio.get_running_loop().time()
        cached = None if thread_id is None else self.history.read_from(thread_id)
        self._starting[run_id] = False
        try:
            start = await self.store.start_run(
                run_id, self.owner, self.lease_ttl, thread_id=thread_id, history_from=cached or 0
            )
        finally:
            stopped = self._starting.pop(run_id)
        if start is None:
            if stopped:
                self.wake()  # as for any stop of a run this worker does not hold
            return  # another worker won it, or it is not runnable
        episode = Episode(
            self.store,
            self.publisher,
            self.agent,
            self.lifecycle,
            start.lease,
            self.history,
            start=start,
            history_from=cached,
            tool_source=self.mcp,
            traceparent=self._links.pop(run_id, None) or traceparent or _stored_link(start),
        )
        if stopped:
            episode.stop_requested.set()  # seen once the episode has started, as any stop
        self.episodes[run_id] = episode
        task = asyncio.create_task(
            self._run_episode(episode, sent + self.lease_ttl), name=f"episode-{run_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_episode(self, episode: Episode, deadline: float) -> None:
        # The heartbeat task starts when the first renewal is due: a run that ends sooner (most
        # do) costs a timer, not a task.
        heartbeats: list[asyncio.Task[None]] = []

        def beat() -> None:
            heartbeats.append(asyncio.create_task(self._heartbeat(episode, deadline)))

        timer = asyncio.get_running_loop().call_later(self._next_beat(deadline), beat)
        try:
            outcome = await episode.run()
        except Exception:
            log.exception("episode of run %s crashed", episode.run_id)
            outcome = None
        finally:
            timer.cancel()
            for heartbeat in heartbeats:
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeat
            self.episodes.pop(episode.run_id, None)
        if not episode.released and (not episode.lease_lost or self._closing):
            # On shutdown the lease is handed back so another worker takes over at once. A
            # terminal commit released it already, in its own transaction.
            with contextlib.suppress(Exception):
                await self.store.release_lease(episode.lease)
        if outcome is not None and outcome.is_terminal and episode.admitted:
            # The terminal commit admitted a queued input as a new run: any worker may take it.
            await self.publisher.wakeup(None)
            self.wake()
        elif self._backlog:
            # Runs were left waiting for a free slot, and this episode freed one.
            self.wake()

    def _margin(self) -> float:
        # Stop a little early: the clocks of this process and the database may drift apart.
        return min(self.lease_ttl * 0.1, 1.0)

    def _next_beat(self, deadline: float) -> float:
        """Seconds until the next renewal: the next beat of the worker's grid (every third of
        the TTL, shared by all its runs so their renewals go out together: `beat_delay`), or
        sooner when the lease could expire (minus the margin) before that."""
        now = asyncio.get_running_loop().time()
        beat = beat_delay(now, max(self.lease_ttl / 3, 0.05))
        return min(beat, max(deadline - self._margin() - now, 0))

    async def _heartbeat(self, episode: Episode, deadline: float) -> None:
        """Renew the lease, now (`_run_episode` starts this when the first renewal is due) and
        every `_next_beat`; notice stop requests that arrived while the bus was down.

        `deadline` is when the lease could have expired by this process's clock: the TTL counted
        from the moment the last successful acquisition or renewal was *sent* (the database
        granted it later, so it expires later). Once it passes without a renewal, the episode
        stops streaming and executing at once, before another worker can take the run over;
        a renewal stuck in storage retries is not waited for."""
        loop = asyncio.get_running_loop()
        margin = self._margin()
        first = True
        while True:
            if not first:
                await asyncio.sleep(self._next_beat(deadline))
            first = False
            sent = loop.time()
            try:
                renewal = await asyncio.wait_for(
                    self._renewals.renew(episode.lease), max(deadline - margin - sent, 0.001)
                )
            except Exception:
                if loop.time() >= deadline - margin:
                    log.warning("run %s: lease could have expired; stopping", episode.run_id)
                    episode.lose_lease()
                    return
                log.warning("lease renewal of run %s failed", episode.run_id, exc_info=True)
                continue
            if renewal.lease is None:  # expired or taken over
                episode.lose_lease()
                return
            episode.lease = renewal.lease
            deadline = sent + self.lease_ttl
            if renewal.stop:  # asked to stop or cancelled: a stop the bus may have lost
                episode.stop_requested.set()
