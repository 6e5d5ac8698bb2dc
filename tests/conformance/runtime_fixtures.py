"""The `runtime_for` fixture: a runtime (service + workers) over the parametrised `store`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from runtime.agent import Agent
from tests.conformance.runtime_harness import Runtime

RuntimeFactory = Callable[..., Awaitable[Runtime]]


@pytest.fixture
async def runtime_for(store: Any) -> AsyncIterator[RuntimeFactory]:
    runtimes: list[Runtime] = []

    async def factory(agent: Agent, workers: int = 1, **kwargs: Any) -> Runtime:
        rt = Runtime(store, agent, **kwargs)
        await rt.bus.open()
        runtimes.append(rt)
        for _ in range(workers):
            await rt.start_worker()
        return rt

    yield factory
    for rt in runtimes:
        await rt.close()
