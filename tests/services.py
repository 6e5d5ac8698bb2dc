"""Postgres and Redis for tests: servers of the run's own, a database or key prefix per test."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.servers import PostgresServer, RedisClusterServer, RedisServer, ServiceUnavailable

# Point the suite at existing servers instead of starting its own: an admin DSN (a database
# where CREATE DATABASE works) and a Redis URL.
POSTGRES_OVERRIDE = "THREADLINE_TEST_POSTGRES_DSN"
REDIS_OVERRIDE = "THREADLINE_TEST_REDIS_URL"
IN_CI = os.environ.get("CI", "").lower() == "true"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _missing(message: str) -> None:
    """Skip when a service is missing, except under CI=true, where that is a failure."""
    if IN_CI:
        pytest.fail(f"{message} (CI=true: services are required)")
    pytest.skip(message)


def _first_host(address: str, default_port: int) -> tuple[str, int]:
    if "+cluster://" in address:
        from realtime.redis_urls import parse_cluster_url

        return parse_cluster_url(address).seeds[0]
    parts = urlsplit(address)
    return parts.hostname or "127.0.0.1", parts.port or default_port


class _OwnService:
    """One server per test run, started on first use, stopped by `stop_own_services()`.
    A start that failed is remembered: later tests fail (or skip) at once, not after another
    attempt of several seconds each."""

    def __init__(self, name: str, override: str, start: Callable[[], Any], default_port: int):
        self.name = name
        self.override = override
        self._start = start
        self._default_port = default_port
        self._server: Any = None
        self._problem: tuple[bool, str] | None = None  # (missing rather than broken, message)
        self._lock = threading.Lock()

    def address(self) -> str:
        """The DSN/URL to use; skips or fails the calling test when there is none."""
        given = os.environ.get(self.override)
        if given:
            host, port = _first_host(given, self._default_port)
            if not _reachable(host, port):
                _missing(f"{self.name} is not reachable at {host}:{port} (from {self.override})")
            return given
        with self._lock:
            if self._server is None and self._problem is None:
                try:
                    self._server = self._start()
                except ServiceUnavailable as exc:
                    self._problem = (True, str(exc))
                except Exception as exc:
                    self._problem = (False, f"starting {self.name} failed: {exc}")
        if self._problem is not None:
            missing, message = self._problem
            if missing:
                _missing(message)
            pytest.fail(message)
        return str(self._server.address)

    @property
    def server(self) -> Any:
        return self._server

    def stop(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.stop()
                self._server = None


_POSTGRES = _OwnService("PostgreSQL", POSTGRES_OVERRIDE, lambda: PostgresServer().start(), 5432)
_REDIS = _OwnService("Redis", REDIS_OVERRIDE, lambda: RedisServer().start(), 6379)
# A cluster named by this variable is used as is; the failover tests need one of our own.
REDIS_CLUSTER_OVERRIDE = "THREADLINE_TEST_REDIS_CLUSTER_URL"
_REDIS_CLUSTER = _OwnService(
    "Redis Cluster", REDIS_CLUSTER_OVERRIDE, lambda: RedisClusterServer().start(), 6379
)


def require_postgres() -> str:
    """The admin DSN of the run's PostgreSQL (its own cluster unless overridden)."""
    return _POSTGRES.address()


def require_redis() -> str:
    """The URL of the run's Redis (its own server unless overridden)."""
    return _REDIS.address()


def require_redis_cluster() -> str:
    """The `redis+cluster://` URL of the run's Redis Cluster (3 masters, 3 replicas)."""
    return _REDIS_CLUSTER.address()


def own_redis_cluster() -> RedisClusterServer:
    """The run's own cluster, to kill and restart nodes of (fails the test under an override)."""
    require_redis_cluster()
    server = _REDIS_CLUSTER.server
    if not isinstance(server, RedisClusterServer):
        pytest.skip(f"{REDIS_CLUSTER_OVERRIDE} names a cluster this run does not own")
    return server


def own_postgres() -> PostgresServer | None:
    """The run's own PostgreSQL server, to restart (None under an override: not ours)."""
    require_postgres()
    server = _POSTGRES.server
    return server if isinstance(server, PostgresServer) else None


def stop_own_services() -> None:
    """Stop the servers this run started (pytest_unconfigure); overrides are left alone."""
    _POSTGRES.stop()
    _REDIS.stop()
    _REDIS_CLUSTER.stop()


async def _admin_execute(admin_dsn: str, sql: str) -> None:
    import asyncpg

    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(sql)
    finally:
        await admin.close()


def _sibling_dsn(admin_dsn: str, name: str) -> str:
    return admin_dsn.rsplit("/", 1)[0] + "/" + name


async def create_database(admin_dsn: str, prefix: str) -> str:
    """Create a database named `prefix` + random hex through `admin_dsn`; returns its DSN."""
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    await _admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    return _sibling_dsn(admin_dsn, name)


async def drop_database(admin_dsn: str, dsn: str, prefix: str) -> None:
    """Drop the database of `dsn`, refusing any name not made by create_database(prefix)."""
    name = dsn.rsplit("/", 1)[1]
    assert name.startswith(prefix), "only drop what we created"
    await _admin_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@asynccontextmanager
async def own_postgres_database(
    admin_dsn: str, prefix: str = "threadline_test_"
) -> AsyncIterator[str]:
    """Create a database of our own, yield its DSN, drop it (and only it) afterwards."""
    dsn = await create_database(admin_dsn, prefix)
    try:
        yield dsn
    finally:
        await drop_database(admin_dsn, dsn, prefix)


@asynccontextmanager
async def temporary_postgres_database() -> AsyncIterator[str]:
    """A database of the test's own (Postgres is required under CI=true)."""
    async with own_postgres_database(require_postgres()) as dsn:
        yield dsn


def unique_prefix() -> str:
    """A Redis key/channel prefix of our own, so parallel tests never see each other."""
    return f"threadline-test-{uuid.uuid4().hex[:10]}:"


def _run_in_own_loop(fn: Any) -> None:
    """Run a coroutine function to completion on a fresh loop in a helper thread: session
    fixtures may be first requested from inside a running test loop."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(lambda: asyncio.run(fn())).result()


def create_postgres_database_sync() -> str:
    """Create a database of our own outside any running event loop (for session fixtures)."""
    admin_dsn = require_postgres()
    created: list[str] = []

    async def create() -> None:
        created.append(await create_database(admin_dsn, "threadline_test_"))

    _run_in_own_loop(create)
    return created[0]


def drop_postgres_database_sync(dsn: str) -> None:
    admin_dsn = require_postgres()
    _run_in_own_loop(lambda: drop_database(admin_dsn, dsn, "threadline_test_"))


async def empty_postgres_database(dsn: str) -> None:
    """Remove every row the previous test left; the schema, the migration records and the
    fencing counter (tokens only ever grow) stay."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        tables = [
            row["tablename"]
            for row in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename NOT IN ('schema_migrations', 'fencing_counter')"
            )
        ]
        if tables:
            await conn.execute(
                "TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE"
            )
    finally:
        await conn.close()
