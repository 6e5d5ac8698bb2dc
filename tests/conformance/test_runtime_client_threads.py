"""Client-chosen thread ids live inside the caller's scope, on every store."""

from __future__ import annotations

from typing import Any

from runtime.demo import demo_agent
from runtime.domain import Principal, Role
from runtime.service.client_threads import client_thread_id, open_client_thread
from tests.conformance.runtime_fixtures import RuntimeFactory

A = Principal(subject="ann", role=Role.USER, scopes=frozenset({"a"}))
B = Principal(subject="bea", role=Role.USER, scopes=frozenset({"b"}))


async def test_a_foreign_client_id_behaves_like_a_free_one(
    store: Any, runtime_for: RuntimeFactory
) -> None:
    service = (await runtime_for(demo_agent(), workers=0)).service
    taken = await open_client_thread(service, A, "shared-id", create=True)
    # Scope b: the id a uses and an id nobody uses look the same, before and after creation.
    foreign = await open_client_thread(service, B, "shared-id", create=False)
    free = await open_client_thread(service, B, "free-id", create=False)
    assert foreign.snapshot is None and free.snapshot is None
    assert foreign.thread_id == client_thread_id("b", "shared-id") != taken.thread_id
    mine = await open_client_thread(service, B, "shared-id", create=True)
    assert mine.snapshot is not None and mine.snapshot.thread.scope == "b"
    # Neither claimed the other's: a's thread is a's, and opening it again finds the same one.
    again = await open_client_thread(service, A, "shared-id", create=True)
    assert again.thread_id == taken.thread_id
    assert again.snapshot is not None and again.snapshot.thread.scope == "a"
    assert (
        await open_client_thread(service, B, "shared-id", create=True)
    ).thread_id == mine.thread_id
