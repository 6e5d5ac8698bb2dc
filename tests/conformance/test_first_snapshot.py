"""A thread's first snapshot, built when it is created without reading it back, is the one
storage reads for it, on every backend, bounded and whole."""

from __future__ import annotations

import pytest

from realtime import MemoryBus
from runtime.demo import demo_agent
from runtime.domain import Principal, Role
from runtime.engine.publisher import Publisher
from runtime.service.thread_service import ThreadService
from runtime.storage.store import Store

ALICE = Principal(subject="alice", role=Role.USER, scopes=frozenset({"acme"}))


@pytest.mark.parametrize("bound", [None, 1, 100])
async def test_the_created_snapshot_is_the_committed_one(store: Store, bound: int | None) -> None:
    async with MemoryBus() as bus:
        service = ThreadService(store, Publisher(bus), demo_agent(), snapshot_messages=bound)
        created = await service.create_thread(
            ALICE, title="first", metadata={"topic": "weather", "n": 1}
        )
        read = await service.snapshot(ALICE, created.thread.id)
        assert created == read
        assert created.to_wire() == read.to_wire()
