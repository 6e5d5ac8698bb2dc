"""Fixtures of the fault suite: a Postgres database of the test's own, proxies in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.faults.proxy import FaultProxy, ProxyFactory
from tests.services import temporary_postgres_database


def via(dsn: str, proxy: FaultProxy) -> str:
    """`dsn` with its host and port replaced by the proxy's."""
    parts = urlsplit(dsn)
    auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{proxy.port}"))


def target(dsn: str) -> tuple[str, int]:
    parts = urlsplit(dsn)
    return parts.hostname or "127.0.0.1", parts.port or 5432


@pytest.fixture
async def database() -> AsyncIterator[str]:
    async with temporary_postgres_database() as dsn:
        yield dsn


@pytest.fixture
async def make_proxy(database: str) -> AsyncIterator[ProxyFactory]:
    """Proxies to the test's database; all closed at the end of the test."""
    opened: list[FaultProxy] = []
    host, port = target(database)

    class Bound(FaultProxy):
        def __init__(self) -> None:
            super().__init__(host, port)
            opened.append(self)

    yield Bound
    for proxy in opened:
        await proxy.__aexit__(None, None, None)
