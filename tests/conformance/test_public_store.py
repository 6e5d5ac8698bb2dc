"""The wrapper the store suites also run on exposes the `Store` interface and nothing else."""

from __future__ import annotations

from pathlib import Path

from runtime.storage import SqliteStore
from runtime.storage.store import EngineStore, Store, TokenStore
from tests.conformance.public_store import STORE_MEMBERS, PublicStore, interface_members


def test_the_members_are_every_part_of_the_interface() -> None:
    assert interface_members(TokenStore) == {
        "create_token",
        "live_tokens",
        "principal_for_token",
        "revocation_count",
        "revoke_token",
        "token_expires_in",
        "token_grant",
    }
    assert interface_members(EngineStore) < STORE_MEMBERS
    assert {"open", "migrate", "commit", "start_run", "thread_scopes", "db_time"} <= STORE_MEMBERS
    assert not any(name.startswith("_") for name in STORE_MEMBERS)
    # Every member is something the SQL backends implement.
    assert all(callable(getattr(SqliteStore, name)) for name in STORE_MEMBERS)


async def test_the_wrapper_hides_what_is_not_the_interface(tmp_path: Path) -> None:
    async with PublicStore(SqliteStore(tmp_path / "t.db")) as store:
        public: Store = store
        thread = await public.create_thread("acme", "t")
        assert (await public.get_thread(thread.id, ["acme"])).title == "t"
        for private in ("pool", "dialect", "_read", "_run", "applied_migrations", "backend"):
            assert not hasattr(store, private), private
