"""Helpers shared by the benchmarks: percentiles, throwaway servers, a database of their own."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.servers import own_postgres_server, own_redis_server
from tests.services import own_postgres_database


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def own_database(admin_dsn: str) -> AbstractAsyncContextManager[str]:
    """A database created through `admin_dsn` for this run, dropped (and only it) after."""
    return own_postgres_database(admin_dsn, prefix="threadline_bench_")


@contextmanager
def servers(postgres: str | None, redis: str | None) -> Iterator[tuple[str, str]]:
    """(admin DSN, Redis URL): the given ones, or throwaway servers started for this run on free
    loopback ports and removed afterwards (a developer's own servers are never used unasked)."""
    with ExitStack() as stack:
        if postgres is None:
            print("starting a throwaway PostgreSQL cluster for this run", file=sys.stderr)
            postgres = stack.enter_context(own_postgres_server())
        if redis is None:
            print("starting a throwaway redis-server for this run", file=sys.stderr)
            redis = stack.enter_context(own_redis_server())
        yield postgres, redis
