"""Helpers shared by the benchmarks: percentiles, throwaway servers, a database of their own,
a deployment of `threadline serve` processes."""

from __future__ import annotations

import asyncio
import signal
import sys
import tempfile
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.e2e import harness
from tests.servers import own_postgres_server, own_redis_server
from tests.services import own_postgres_database

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T], *, loop: str = "asyncio") -> T:
    """Run a benchmark's `main` on `loop` ("asyncio" or "uvloop"). SIGTERM cancels it, so the
    servers, deployments and databases it made are removed on the way out as after any other
    end (a bench killed with SIGTERM otherwise left its served processes running and its
    database behind)."""

    async def cancellable() -> T:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await main

    if loop == "uvloop":
        import uvloop

        return uvloop.run(cancellable())
    return asyncio.run(cancellable())


def pct(values: Sequence[float], q: float) -> float:
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


@contextmanager
def deployment(
    database_url: str,
    redis_url: str,
    roles: Sequence[str],
    extra: Mapping[str, str] | None = None,
) -> Iterator[list[harness.ServerHandle]]:
    """`threadline serve --role <role>` for each of `roles`, in that order (the first applies the
    migrations, so it should be a gateway), on the given database and Redis, polling every 0.2 s,
    with no cap on one token's websockets (`extra`: more environment); all stopped on the way
    out, whatever happened."""
    env = harness.server_env(
        database_url,
        {
            "THREADLINE_REDIS_URL": redis_url,
            "THREADLINE_POLL_INTERVAL": "0.2",
            # One token opens every websocket: the benches measure the servers, not these caps.
            "THREADLINE_WS_MAX_CONNECTIONS_PER_TOKEN": "1000000",
            "THREADLINE_WS_MAX_CONNECTIONS_PER_SUBJECT": "1000000",
            **(extra or {}),
        },
    )
    log_dir = Path(tempfile.mkdtemp(prefix="threadline-bench-"))
    started: list[harness.ServerHandle] = []
    try:
        for role in roles:
            started.append(harness.start(role, env, log_dir=log_dir))
        yield started
    finally:
        for handle in started:
            with suppress(Exception):
                handle.stop()
