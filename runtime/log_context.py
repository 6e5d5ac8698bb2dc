"""Ids that log lines carry where known (request, thread, run): context variables, set per task."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

# One variable per id: a task inherits its creator's values (asyncio copies the context), so an
# episode task started by a request carries the request's id as well as its own run's.
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
thread_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("thread_id", default=None)
run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("run_id", default=None)

FIELDS = {"request_id": request_id, "thread_id": thread_id, "run_id": run_id}


def current() -> dict[str, str]:
    """The ids set in this context, by field name."""
    return {name: value for name, var in FIELDS.items() if (value := var.get()) is not None}


@contextmanager
def bound(**ids: str | None) -> Iterator[None]:
    """Set some of the ids for the block (None leaves one as it is), then restore them."""
    tokens = [(FIELDS[name], FIELDS[name].set(value)) for name, value in ids.items() if value]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def bind_task(**ids: str | None) -> None:
    """Set some of the ids for the rest of the current task: an HTTP endpoint's thread id
    then reaches the access line its server logs after the endpoint returned. Each request
    runs in a task of its own, so nothing leaks into the next one."""
    for name, value in ids.items():
        if value:
            FIELDS[name].set(value)
