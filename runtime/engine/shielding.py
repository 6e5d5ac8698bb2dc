"""Work that a cancellation must not tear: it runs to its end, then the cancellation proceeds."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def uncancellable(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` to completion even if the caller is cancelled meanwhile.

    `asyncio.shield` alone is not enough: it lets the caller go on (to stop handling, say) while
    the shielded write is still in flight, so the caller would decide from state the write has
    not updated yet. Here the caller waits for the work to finish. Then, if the work raised, its
    exception propagates (the outcome of the write decides, e.g. `LeaseLost`); otherwise a
    cancellation that arrived meanwhile is raised now, after the work's effects are in place.
    """
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            # Unlike awaiting the task, asyncio.wait leaves it running when we are cancelled.
            await asyncio.wait({task})
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if task.cancelled() or task.exception() is None:
            raise asyncio.CancelledError
        # The work's own failure is what the caller handles; the cancellation is consumed, and
        # uncounted so that asyncio's bookkeeping (timeouts, task groups) stays consistent.
        current = asyncio.current_task()
        if current is not None:
            current.uncancel()
    return task.result()


class StrayCancellation(RuntimeError):
    """A CancelledError that no cancellation of the episode's task caused: code of the run (a
    hook, a model stream, something they awaited) raised it. The spec's "thrown errors fail the
    run" applies to it like to any exception; only the runtime's own cancellations (stop,
    shutdown, lease loss, a sibling tool's failure) stop work without failing the run."""


def runtime_cancelled() -> bool:
    """Whether the current task is being cancelled (`Task.cancel`): every cancellation the
    runtime makes goes through it, so a CancelledError raised while this is False was raised
    (or re-raised from an awaited future) by the code the episode ran."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def stray(exc: asyncio.CancelledError) -> StrayCancellation:
    detail = f": {exc}" if str(exc) else ""
    return StrayCancellation(f"CancelledError raised inside the run, not by a stop{detail}")
