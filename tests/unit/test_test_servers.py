"""The suite's own servers: throwaway, side by side, overridable, never silently skipped in CI."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests import servers, services


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@contextmanager
def _listening() -> Iterator[str]:
    """A Redis-looking URL whose port accepts connections (nothing more is asked of it)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"


def test_two_redis_servers_run_side_by_side_and_leave_nothing() -> None:
    try:
        first = servers.RedisServer().start()
    except servers.ServiceUnavailable as exc:
        services._missing(str(exc))
    second = servers.RedisServer().start()
    try:
        assert first.port != second.port
        assert 6379 not in (first.port, second.port)
        assert first._pings() and second._pings()
    finally:
        first.stop()
        second.stop()
    assert not first.directory.exists() and not second.directory.exists()
    assert not first._pings()


@pytest.mark.postgres
async def test_the_run_has_a_throwaway_postgres_of_its_own() -> None:
    import asyncpg

    if services.POSTGRES_OVERRIDE in os.environ:
        pytest.skip("the suite was pointed at an existing PostgreSQL")
    dsn = services.require_postgres()
    assert services.require_postgres() == dsn, "one cluster per run"
    assert urlsplit(dsn).port != 5432
    conn = await asyncpg.connect(dsn)
    try:
        data = await conn.fetchval("SELECT current_setting('data_directory')")
        fsync = await conn.fetchval("SELECT current_setting('fsync')")
        sockets = await conn.fetchval("SELECT current_setting('unix_socket_directories')")
    finally:
        await conn.close()
    assert Path(data).parent.name.startswith("threadline-pg-")
    assert sockets == str(Path(data).parent)
    assert fsync == "off"


def test_an_override_is_used_as_given_and_nothing_is_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def start() -> None:
        raise AssertionError("an override must not start a server")

    service = services._OwnService("Redis", "TL_TEST_OVERRIDE", start, 6379)
    with _listening() as url:
        monkeypatch.setenv("TL_TEST_OVERRIDE", url)
        assert service.address() == url


def test_an_unreachable_override_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    service = services._OwnService("Redis", "TL_TEST_OVERRIDE", lambda: None, 6379)
    monkeypatch.setenv("TL_TEST_OVERRIDE", f"redis://127.0.0.1:{servers.free_port()}/0")
    monkeypatch.setattr(services, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="not reachable"):
        service.address()
    monkeypatch.setattr(services, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="not reachable"):
        service.address()


def test_missing_programs_skip_or_fail_once(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []

    def start() -> None:
        attempts.append(1)
        raise servers.ServiceUnavailable("redis-server is not installed")

    service = services._OwnService("Redis", "TL_TEST_UNSET", start, 6379)
    monkeypatch.delenv("TL_TEST_UNSET", raising=False)
    monkeypatch.setattr(services, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        service.address()
    monkeypatch.setattr(services, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        service.address()
    assert attempts == [1], "a failed start is remembered, not retried per test"


def test_a_broken_start_fails_even_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    def start() -> None:
        raise servers.ServiceFailed("initdb failed (1)")

    service = services._OwnService("PostgreSQL", "TL_TEST_UNSET", start, 5432)
    monkeypatch.delenv("TL_TEST_UNSET", raising=False)
    monkeypatch.setattr(services, "IN_CI", False)
    with pytest.raises(pytest.fail.Exception, match="initdb failed"):
        service.address()


def test_leftovers_of_a_killed_run_are_swept_and_live_ones_kept() -> None:
    stale = Path(tempfile.mkdtemp(prefix="threadline-redis-"))
    (stale / servers.OWNER_FILE).write_text(str(_dead_pid()))
    live = Path(tempfile.mkdtemp(prefix="threadline-redis-"))
    (live / servers.OWNER_FILE).write_text(str(os.getpid()))
    try:
        servers.sweep_stale_dirs()
        assert not stale.exists()
        assert live.exists()
    finally:
        for path in (stale, live):
            shutil.rmtree(path, ignore_errors=True)
