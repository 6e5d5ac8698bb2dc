"""The thread -> scope cache behind the publisher's per-scope announcements."""

from __future__ import annotations

from collections.abc import Sequence

from realtime.channels import scope_channel
from realtime.memory import MemoryBus
from runtime.engine.publisher import Publisher
from runtime.storage.scope_cache import ScopeCache


class Scopes:
    def __init__(self, scopes: dict[str, str]) -> None:
        self.scopes = scopes
        self.reads: list[list[str]] = []

    async def thread_scopes(self, thread_ids: Sequence[str]) -> dict[str, str]:
        self.reads.append(list(thread_ids))
        return {t: self.scopes[t] for t in thread_ids if t in self.scopes}


async def test_a_scope_is_read_once_and_an_unknown_thread_is_not_cached() -> None:
    source = Scopes({"thr-1": "acme"})
    cache = ScopeCache(source)
    assert await cache.scope_of("thr-1") == "acme"
    assert await cache.scope_of("thr-1") == "acme"
    assert await cache.scope_of("thr-9") is None
    assert await cache.scope_of("thr-9") is None
    assert source.reads == [["thr-1"], ["thr-9"], ["thr-9"]]


async def test_a_remembered_scope_needs_no_read_and_the_oldest_goes_first() -> None:
    source = Scopes({"thr-1": "acme", "thr-2": "acme", "thr-3": "globex"})
    cache = ScopeCache(source, max_cached=2)
    cache.remember("thr-1", "acme")
    cache.remember("thr-2", "acme")
    assert await cache.scope_of("thr-1") == "acme"  # thr-1 is the most recent now
    cache.remember("thr-3", "globex")  # thr-2, the least recently used, goes
    assert await cache.scope_of("thr-3") == "globex"
    assert await cache.scope_of("thr-1") == "acme"
    assert source.reads == []
    assert await cache.scope_of("thr-2") == "acme"
    assert source.reads == [["thr-2"]]


async def test_the_publisher_announces_a_known_scope_without_reading_it() -> None:
    source = Scopes({})  # storage would not know the thread: the scope must come from the caller
    cache = ScopeCache(source)
    async with MemoryBus() as bus:
        publisher = Publisher(bus, scope_of=cache.scope_of, remember_scope=cache.remember)
        async with bus.subscribe(scope_channel("acme")) as scoped:
            publisher.known_scope("thr-1", "acme")
            assert await publisher.invalidate("thr-1", 3)
            announced = await anext(aiter(scoped))
    assert b"thr-1" in announced
    assert source.reads == []
