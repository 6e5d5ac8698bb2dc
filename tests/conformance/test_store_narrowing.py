"""Store conformance: thread owners, and an authorization hook's narrowing (`ThreadQuery.allowed`,
`pending_actions(allowed=…)`) applied by the store, with exact pages."""

from __future__ import annotations

from runtime.authorization import ThreadMatch
from runtime.storage.store import Store
from runtime.storage.thread_query import ThreadQuery, page_cursor
from tests.conformance.store_helpers import SCOPE, SCOPES, start_run, suspend

OWN = ThreadMatch(owner="alice")
FINANCE = ThreadMatch(metadata={"group": "finance"})


async def test_a_thread_keeps_its_owner_in_reads_lists_and_snapshots(store: Store) -> None:
    owned = await store.create_thread(SCOPE, "t", owner="alice")
    ownerless = await store.create_thread(SCOPE, "u")
    assert owned.owner == "alice" and ownerless.owner is None
    assert (await store.get_thread(owned.id, SCOPES)).owner == "alice"
    assert (await store.snapshot(owned.id, SCOPES)).thread.owner == "alice"
    renamed = await store.rename_thread(owned.id, SCOPES, "renamed")
    assert renamed.owner == "alice"
    listed = {t.id: t.owner for t in await store.list_threads(SCOPES)}
    assert listed == {owned.id: "alice", ownerless.id: None}


async def test_the_list_keeps_threads_matching_any_allowed_match(store: Store) -> None:
    mine = await store.create_thread(SCOPE, "mine", owner="alice")
    shared = await store.create_thread(SCOPE, "shared", {"group": "finance"}, owner="bob")
    other = await store.create_thread(SCOPE, "other", {"group": "sales"}, owner="bob")
    # An owner and a metadata key in one match must both hold.
    both = await store.create_thread(SCOPE, "both", {"group": "finance"}, owner="alice")

    async def listed(*allowed: ThreadMatch) -> set[str]:
        return {t.id for t in await store.list_threads(SCOPES, query=ThreadQuery(allowed=allowed))}

    assert await listed(OWN, FINANCE) == {mine.id, shared.id, both.id}
    assert await listed(OWN) == {mine.id, both.id}
    assert await listed(ThreadMatch(owner="alice", metadata={"group": "finance"})) == {both.id}
    assert await listed() == set()  # Narrow() with no match: nothing at all
    assert await listed(ThreadMatch()) == {mine.id, shared.id, other.id, both.id}
    everything = await store.list_threads(SCOPES, query=ThreadQuery(allowed=None))
    assert len(everything) == 4
    # With the client's own metadata filter too, both hold.
    query = ThreadQuery(metadata={"group": "finance"}, allowed=(OWN,))
    assert [t.id for t in await store.list_threads(SCOPES, query=query)] == [both.id]


async def test_narrowed_pages_neither_repeat_nor_skip(store: Store) -> None:
    kept = set()
    for n in range(7):
        owner = "alice" if n % 2 == 0 else "bob"
        thread = await store.create_thread(SCOPE, f"t{n}", owner=owner)
        if owner == "alice":
            kept.add(thread.id)
    seen: list[str] = []
    after = None
    for _ in range(10):
        query = ThreadQuery(allowed=(OWN,), after=after)
        page = await store.list_threads(SCOPES, limit=2, query=query)
        seen += [t.id for t in page]
        if len(page) < 2:
            break
        after = page_cursor(page[-1])
    assert sorted(seen) == sorted(kept) and len(seen) == len(kept) == 4


async def test_the_inbox_keeps_the_allowed_threads_only(store: Store) -> None:
    ids: dict[str, str] = {}
    for name, owner, metadata in (
        ("mine", "alice", {}),
        ("shared", "bob", {"group": "finance"}),
        ("other", "bob", {}),
    ):
        thread = await store.create_thread(SCOPE, name, metadata, owner=owner)
        _, lease = await start_run(store, thread.id)
        await suspend(store, lease, f"act-{name}")
        await store.release_lease(lease)
        ids[name] = thread.id

    async def inbox(allowed: tuple[ThreadMatch, ...] | None, limit: int = 100) -> list[str]:
        entries = await store.pending_actions(SCOPES, limit=limit, allowed=allowed)
        return [e.thread_id for e in entries]

    assert sorted(await inbox((OWN, FINANCE))) == sorted([ids["mine"], ids["shared"]])
    assert await inbox(()) == []
    assert sorted(await inbox(None)) == sorted(ids.values())
    # A page of one is full of an allowed thread, not cut short by the ones left out.
    (first,) = await inbox((OWN, FINANCE), limit=1)
    assert first in (ids["mine"], ids["shared"])
