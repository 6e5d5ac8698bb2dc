"""Store conformance: lifecycle, migrations, threads, snapshots, scopes and tokens."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runtime.domain import (
    MAX_METADATA_BYTES,
    MAX_TITLE_CHARS,
    Role,
    RunStatus,
    Visibility,
)
from runtime.errors import Conflict, InvalidInput, NotFound, TooLarge
from runtime.storage import PostgresStore, SqliteStore, open_store
from runtime.storage.store import SetVisibility, StepCommit, Store
from tests.conformance.conftest import StoreFactory
from tests.conformance.ill_typed import ill_typed
from tests.conformance.store_helpers import (
    FOREIGN,
    SCOPE,
    SCOPES,
    assistant,
    finish,
    new_thread,
    resolution,
    start_run,
    suspend,
    text,
)

# --- lifecycle and migrations -------------------------------------------------------------


MIGRATIONS = [
    "0001_init",
    "0002_commit_keys",
    "0003_token_expiry_revocation",
    "0004_action_index_scope_turns",
    "0005_resumed_episode",
    "0006_history_epoch",
    "0007_token_display_name",
    "0008_acquire_run_lease",
    "0009_start_run",
    "0010_token_last_used",
    "0011_timers_schedules_webhooks",
    "0012_approval_decisions_audit",
    "0013_thread_metadata_index",
    "0014_thread_owner",
    "0015_run_traceparent",
    "0016_thread_retention",
    "0017_token_groups",
    "0018_token_revocations",
]


async def test_migrate_is_idempotent(store: Store) -> None:
    # open() already applied everything; running it again (twice) applies nothing.
    assert await store.migrate() == []
    assert await store.migrate() == []
    thread = await new_thread(store)
    assert (await store.get_thread(thread.id, SCOPES)).version == 1


async def test_concurrent_openers_migrate_once(make_store: StoreFactory) -> None:
    # Several processes starting at once on a fresh database: each migration applied once.
    stores = [make_store() for _ in range(3)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        for s in stores:
            assert await s.migrate() == []
        thread = await new_thread(stores[0])
        for other in stores[1:]:
            assert (await other.get_thread(thread.id, SCOPES)).id == thread.id
    finally:
        for s in stores:
            await s.close()


async def test_data_survives_close_and_reopen(make_store: StoreFactory) -> None:
    async with make_store() as store:
        thread = await store.create_thread(SCOPE, "kept", {"k": "v"}, {"secret": 1})
        admission, lease = await start_run(store, thread.id, text="persist me")
        await suspend(store, lease, "act-keep")
        token_version = await store.db_time()
        await store.create_token("hash-1", "alice", Role.USER, [SCOPE])
        before = await store.snapshot(thread.id, SCOPES)
    async with make_store() as reopened:
        after = await reopened.snapshot(thread.id, SCOPES)
        assert after == before
        assert after.pending_actions[0].id == "act-keep"
        assert (await reopened.get_thread(thread.id, SCOPES)).private_metadata == {"secret": 1}
        run = await reopened.get_run(admission.run_id or "")
        assert run.status is RunStatus.WAITING
        principal = await reopened.principal_for_token("hash-1")
        assert principal is not None and principal.subject == "alice"
        assert await reopened.db_time() >= token_version


async def test_close_is_idempotent_and_async_with_closes(make_store: StoreFactory) -> None:
    store = make_store()
    async with store:
        await new_thread(store)
    await store.close()


async def test_open_store_picks_backend_by_scheme(tmp_path: Path) -> None:
    relative = open_store("sqlite:///data/threadline.db")
    assert isinstance(relative, SqliteStore) and relative.path == "data/threadline.db"
    absolute = open_store(f"sqlite:///{tmp_path}/x.db")
    assert isinstance(absolute, SqliteStore) and absolute.path == f"{tmp_path}/x.db"
    assert isinstance(open_store("postgresql://u@h/db"), PostgresStore)
    assert isinstance(open_store("postgres://u@h/db"), PostgresStore)
    with pytest.raises(ValueError):
        open_store("mysql://u@h/db")
    async with open_store(f"sqlite:///{tmp_path}/nested/dir/y.db") as store:
        await new_thread(store)
    assert (tmp_path / "nested" / "dir" / "y.db").exists()


async def test_db_time_is_the_database_clock(store: Store) -> None:
    first = await store.db_time()
    await asyncio.sleep(0.05)
    second = await store.db_time()
    assert 0.04 <= second - first < 5
    assert first > 1_600_000_000  # epoch seconds


# --- threads ------------------------------------------------------------------------------


async def test_create_and_get_thread(store: Store) -> None:
    thread = await store.create_thread(SCOPE, "hello", {"a": 1}, {"p": True})
    assert thread.id.startswith("th_")
    assert thread.version == 1
    assert (thread.scope, thread.title, thread.metadata) == (SCOPE, "hello", {"a": 1})
    assert thread.private_metadata == {"p": True}
    assert await store.get_thread(thread.id, SCOPES) == thread
    assert await store.thread_versions([thread.id, "th_missing"]) == {thread.id: 1}
    assert await store.thread_versions([]) == {}
    assert await store.thread_version(thread.id, SCOPES) == 1
    for thread_id, scopes in ((thread.id, ["other"]), (thread.id, []), ("th_missing", SCOPES)):
        with pytest.raises(NotFound, match="not found"):
            await store.thread_version(thread_id, scopes)


async def test_create_thread_validates_input(store: Store) -> None:
    with pytest.raises(TooLarge):
        await store.create_thread(SCOPE, "x" * (MAX_TITLE_CHARS + 1))
    await store.create_thread(SCOPE, "x" * MAX_TITLE_CHARS)
    with pytest.raises(TooLarge):
        await store.create_thread(SCOPE, "t", {"blob": "x" * MAX_METADATA_BYTES})
    with pytest.raises(TooLarge):
        await store.create_thread(SCOPE, "t", None, {"blob": "x" * MAX_METADATA_BYTES})
    with pytest.raises(InvalidInput):
        await store.create_thread(SCOPE, "t", {"bad": object()})
    with pytest.raises(InvalidInput):
        await store.create_thread(SCOPE, "t", ill_typed(["not", "a", "dict"]))
    with pytest.raises(InvalidInput):
        await store.create_thread("", "t")
    assert len(await store.list_threads(SCOPES)) == 1


async def test_rename_is_one_version_and_every_read_sees_it(store: Store) -> None:
    thread = await new_thread(store, "before")
    renamed = await store.rename_thread(thread.id, SCOPES, "after")
    assert (renamed.title, renamed.version) == ("after", thread.version + 1)
    assert renamed.updated_at >= thread.updated_at
    # The thread returned is the one committed, as every read then sees it.
    assert await store.get_thread(thread.id, SCOPES) == renamed
    assert (await store.snapshot(thread.id, SCOPES)).thread.title == "after"
    assert [t.title for t in await store.list_threads(SCOPES)] == ["after"]
    assert await store.thread_versions([thread.id]) == {thread.id: renamed.version}
    assert await store.thread_version(thread.id, SCOPES) == renamed.version
    cleared = await store.rename_thread(thread.id, SCOPES, "")  # creation allows "" too
    assert (cleared.title, cleared.version) == ("", renamed.version + 1)
    refused = [
        ("x" * (MAX_TITLE_CHARS + 1), TooLarge),
        (ill_typed(None), InvalidInput),
        (ill_typed(["a"]), InvalidInput),
    ]
    for title, error in refused:
        with pytest.raises(error):
            await store.rename_thread(thread.id, SCOPES, title)
    with pytest.raises(NotFound):
        await store.rename_thread("th_missing", SCOPES, "x")
    assert await store.get_thread(thread.id, SCOPES) == cleared  # refusals changed nothing


async def test_list_threads_filters_scopes_and_orders_by_update(store: Store) -> None:
    first = await new_thread(store, "first")
    second = await new_thread(store, "second")
    foreign = await new_thread(store, "foreign", scope="other")
    await asyncio.sleep(0.01)
    await store.submit_input(first.id, SCOPES, text="bump", submitted_by="alice")
    listed = await store.list_threads(SCOPES)
    assert [t.id for t in listed] == [first.id, second.id]
    assert [t.id for t in await store.list_threads(FOREIGN)] == [foreign.id]
    assert len(await store.list_threads([SCOPE, "other"])) == 3
    assert await store.list_threads([]) == []
    assert len(await store.list_threads(SCOPES, limit=1)) == 1
    # A bare string means one scope, never its characters.
    assert [t.id for t in await store.list_threads(SCOPE)] == [first.id, second.id]


async def test_scope_isolation_on_every_scoped_method(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await suspend(store, lease, "act-1")
    queued = await store.submit_input(thread.id, SCOPES, text="later", submitted_by="alice")
    version = (await store.get_thread(thread.id, SCOPES)).version
    calls = [
        store.get_thread(thread.id, FOREIGN),
        store.snapshot(thread.id, FOREIGN),
        store.rename_thread(thread.id, FOREIGN, "hijacked"),
        store.submit_input(thread.id, FOREIGN, text="x", submitted_by="mallory"),
        store.cancel_queued_item(thread.id, FOREIGN, queued.queued_item_id or ""),
        store.request_stop(thread.id, FOREIGN, admission.run_id or ""),
        store.resolve_action(
            thread.id,
            FOREIGN,
            "act-1",
            resolution(),
        ),
    ]
    for call in calls:
        with pytest.raises(NotFound) as caught:
            await call
        # Indistinguishable from an unknown id.
        assert caught.value.code == "not_found"
    assert await store.list_threads(FOREIGN) == []
    assert (await store.get_thread(thread.id, SCOPES)).version == version
    assert (await store.get_run(admission.run_id or "")).stop_requested is False


async def test_unknown_thread_is_not_found(store: Store) -> None:
    for call in (
        store.get_thread("th_nope", SCOPES),
        store.snapshot("th_nope", SCOPES),
        store.submit_input("th_nope", SCOPES, text="x", submitted_by="a"),
        store.list_messages("th_nope"),
        store.list_queue("th_nope"),
        store.get_run("run_nope"),
        store.acquire_run_lease("run_nope", "w", 1.0),
        store.acquire_admin_lease("th_nope", "w", 1.0),
    ):
        with pytest.raises(NotFound):
            await call
    assert await store.active_run("th_nope") is None


# --- snapshots ----------------------------------------------------------------------------


async def test_snapshot_of_new_thread(store: Store) -> None:
    thread = await store.create_thread(SCOPE, "hi", {"pub": 1}, {"priv": 2})
    snapshot = await store.snapshot(thread.id, SCOPES)
    assert snapshot.thread.version == 1
    assert snapshot.thread.metadata == {"pub": 1}
    assert "priv" not in str(snapshot.to_wire())
    assert snapshot.messages == () and snapshot.pending_actions == () and snapshot.queue == ()
    assert snapshot.run is None


async def test_snapshot_projects_visible_messages_pending_actions_run_and_queue(
    store: Store,
) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id, text="first")
    await store.commit(lease, StepCommit(append=(assistant(text("thinking")),)))
    await suspend(store, lease, "act-1", "act-2")
    queued = await store.submit_input(thread.id, SCOPES, text="second", submitted_by="bob")
    snapshot = await store.snapshot(thread.id, SCOPES)
    assert [m.role.value for m in snapshot.messages] == ["user", "assistant", "assistant"]
    assert snapshot.messages[0].parts[0] == text("first")
    assert [a.id for a in snapshot.pending_actions] == ["act-1", "act-2"]
    assert snapshot.pending_actions[0].run_id == admission.run_id
    assert snapshot.pending_actions[0].message_id == snapshot.messages[-1].id
    assert snapshot.run is not None and snapshot.run.id == admission.run_id
    assert snapshot.run.status is RunStatus.WAITING and snapshot.run.started_by == "alice"
    assert [(q.id, q.text, q.submitted_by) for q in snapshot.queue] == [
        (queued.queued_item_id, "second", "bob")
    ]
    assert snapshot.thread.version == queued.version
    # Reads never bump.
    again = await store.snapshot(thread.id, SCOPES)
    assert again == snapshot


async def test_snapshot_hides_hidden_messages_but_list_messages_keeps_them(
    store: Store,
) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    await store.commit(lease, StepCommit(append=(assistant(text("a")), assistant(text("b")))))
    await finish(store, lease)
    messages = await store.list_messages(thread.id)
    admin = await store.acquire_admin_lease(thread.id, "admin", 10.0)
    assert admin is not None
    await store.rewrite_history(
        admin, SetVisibility(message_id=messages[1].id, visibility=Visibility.HIDDEN)
    )
    snapshot = await store.snapshot(thread.id, SCOPES)
    assert [m.id for m in snapshot.messages] == [messages[0].id, messages[2].id]
    listed = await store.list_messages(thread.id)
    assert [m.visibility for m in listed] == [
        Visibility.VISIBLE,
        Visibility.HIDDEN,
        Visibility.VISIBLE,
    ]
    assert [m.position for m in listed] == [0, 1, 2]
    assert [m.id for m in await store.list_messages(thread.id, up_to_position=1)] == [
        messages[0].id,
        messages[1].id,
    ]


# --- tokens -------------------------------------------------------------------------------


async def test_tokens_store_only_the_hash(store: Store) -> None:
    await store.create_token("sha256:abc", "svc", Role.BACKEND, ["a", "b"])
    principal = await store.principal_for_token("sha256:abc")
    assert principal is not None
    assert (principal.subject, principal.role, principal.scopes) == (
        "svc",
        Role.BACKEND,
        frozenset({"a", "b"}),
    )
    assert await store.principal_for_token("sha256:other") is None
    with pytest.raises(Conflict):
        await store.create_token("sha256:abc", "someone-else", Role.ADMIN, ["a"])
    with pytest.raises(InvalidInput):
        await store.create_token("sha256:x", "svc", ill_typed("root"), ["a"])
