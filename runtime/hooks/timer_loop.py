"""The timer loop every worker runs: claim due timers with a lease, fire each in one transaction."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from runtime.engine.publisher import Publisher
from runtime.storage.hooks_store import DueTimer, HooksStore
from runtime.storage.sql.rows import new_id
from runtime.storage.store import AdmissionLimits

log = logging.getLogger(__name__)


class TimerLoop:
    """Polls for due timers (the database clock decides what is due); a fire that admitted a
    run publishes its invalidation and wakeup once committed, as a sent message does."""

    def __init__(
        self,
        store: HooksStore,
        publisher: Publisher,
        *,
        limits: AdmissionLimits | None = None,
        poll_interval: float = 0.2,
        lease_ttl: float = 30.0,
        batch: int = 20,
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.limits = limits
        self.poll_interval = poll_interval
        self.lease_ttl = lease_ttl
        self.batch = batch
        # The process id in the owner says which worker holds a timer's lease (operators
        # and the deadline fault test read it from the timer row).
        self.owner = owner or new_id(f"timers-{os.getpid()}")
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> TimerLoop:
        self._task = asyncio.create_task(self._loop(), name="timer-loop")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            try:
                full = await self.run_due()
            except Exception:
                log.warning("timer round failed", exc_info=True)
                full = False
            if not full:
                await asyncio.sleep(self.poll_interval)

    async def run_due(self) -> bool:
        """Claim and fire what is due; whether the claim was full (more may be waiting)."""
        timers = await self.store.claim_timers(self.owner, self.lease_ttl, self.batch)
        for timer in timers:
            await self._fire(timer)
        return len(timers) >= self.batch

    async def _fire(self, timer: DueTimer) -> None:
        try:
            result = await self.store.fire_timer(timer, self.limits)
        except Exception:
            # The lease expires and a worker fires it then: nothing was committed.
            log.warning("timer %s failed to fire", timer.id, exc_info=True)
            return
        if result.fired and result.thread_id is not None and result.version is not None:
            await self.publisher.invalidate(
                result.thread_id,
                result.version,
                stop=result.stop_run_id,
                wakeup=result.run_id,
            )


__all__ = ["TimerLoop"]
