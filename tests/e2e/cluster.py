"""Multi-process Threadline over Postgres and Redis: databases, processes, tokens, Redis clients."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.e2e import harness
from tests.services import require_redis, temporary_postgres_database

# Fast fallbacks: a lost wakeup or a bus outage costs a fifth of a second, not a whole second.
POLL_INTERVAL = "0.2"


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A database of our own for the duration of the block (dropped, even if processes live)."""
    loop = asyncio.new_event_loop()
    manager = temporary_postgres_database()
    try:
        url = loop.run_until_complete(manager.__aenter__())
        try:
            yield url
        finally:
            loop.run_until_complete(manager.__aexit__(None, None, None))
    finally:
        loop.close()


def cluster_env(
    database_url: str, redis_url: str | None = None, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment every process of one cluster shares (storage, bus, poll interval)."""
    shared = {
        "THREADLINE_REDIS_URL": redis_url or require_redis(),
        "THREADLINE_POLL_INTERVAL": POLL_INTERVAL,
    }
    return harness.server_env(database_url, {**shared, **(extra or {})})


@dataclass
class Cluster:
    """Gateways and workers sharing one database and one Redis; `stop()` ends all of them."""

    env: dict[str, str]
    log_dir: Path
    processes: list[harness.ServerHandle] = field(default_factory=list)

    @property
    def gateways(self) -> list[harness.ServerHandle]:
        return [p for p in self.processes if p.role in ("gateway", "all")]

    def start(
        self, roles: Sequence[str], extra: dict[str, str] | None = None
    ) -> list[harness.ServerHandle]:
        """Start processes side by side; if one fails, the others of this call are stopped."""
        env = {**self.env, **(extra or {})}
        with ThreadPoolExecutor(max_workers=max(1, len(roles))) as pool:
            futures = [
                pool.submit(harness.start, role, env, log_dir=self.log_dir) for role in roles
            ]
            started: list[harness.ServerHandle] = []
            errors: list[BaseException] = []
            for future in futures:
                try:
                    started.append(future.result(timeout=harness.START_TIMEOUT + 15))
                except BaseException as exc:
                    errors.append(exc)
        if errors:
            for handle in started:
                handle.stop()
            raise errors[0]
        self.processes += started
        return started

    def tokens(
        self, specs: dict[str, TokenSpec], expires_in: float | None = None
    ) -> dict[str, str]:
        """Mint several tokens in this process, as `threadline token create` does (one Python
        start-up per token would cost seconds); works inside a running event loop too.
        A spec is (scope(s), role, subject) or (scope(s), role, subject, display name)."""
        return mint(self.env["THREADLINE_DATABASE_URL"], specs, expires_in)

    def logs(self) -> str:
        return "\n".join(f"--- {p.role} :{p.port} ---\n{p.log()[-3000:]}" for p in self.processes)

    def stop(self) -> None:
        for handle in self.processes:
            with contextlib.suppress(Exception):
                handle.stop()


TokenSpec = tuple[str | list[str], str, str] | tuple[str | list[str], str, str, str]


def mint(
    database_url: str,
    specs: dict[str, TokenSpec],
    expires_in: float | None = None,
    groups: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, str]:
    """`Cluster.tokens` on any storage `database_url` names; `groups` by token name."""
    minting = _mint(database_url, specs, expires_in, groups)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, minting).result(timeout=60)


async def _mint(
    database_url: str,
    specs: dict[str, TokenSpec],
    expires_in: float | None = None,
    groups: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, str]:
    from runtime.domain import Role
    from server.app import open_storage
    from server.auth import create_token

    async with contextlib.AsyncExitStack() as stack:
        store = await open_storage(database_url, stack)
        minted = {}
        for name, (scope, role, subject, *display) in specs.items():
            scopes = [scope] if isinstance(scope, str) else scope
            minted[name] = await create_token(
                store,
                subject=subject,
                role=Role(role),
                scopes=scopes,
                expires_in=expires_in,
                display_name=display[0] if display else None,
                groups=(groups or {}).get(name, ()),
            )
        return minted


@contextlib.contextmanager
def cluster(
    roles: Sequence[str], extra: dict[str, str] | None = None, log_dir: Path | None = None
) -> Iterator[Cluster]:
    """A fresh Postgres database, and `roles` processes on it and on Redis."""
    with postgres_database() as database_url:
        directory = log_dir or Path(tempfile.mkdtemp(prefix="threadline-cluster-"))
        running = Cluster(cluster_env(database_url, extra=extra), directory)
        try:
            if roles:
                running.start(roles)
            yield running
        finally:
            running.stop()


# --- Redis connections of our processes --------------------------------------------------


def _redis_port(url: str) -> int:
    from urllib.parse import urlsplit

    return urlsplit(url).port or 6379


def local_ports_to(pid: int, port: int) -> set[int]:
    """Local ports of `pid`'s TCP connections to `port` on this machine."""
    ports: set[int] = set()
    with contextlib.suppress(psutil.Error):
        for conn in psutil.Process(pid).net_connections(kind="tcp"):
            if conn.raddr and conn.raddr.port == port and conn.status == psutil.CONN_ESTABLISHED:
                ports.add(conn.laddr.port)
    return ports


def parse_client_list(text: str) -> list[dict[str, str]]:
    clients = []
    for line in text.splitlines():
        fields = dict(item.split("=", 1) for item in line.split(" ") if "=" in item)
        if fields:
            clients.append(fields)
    return clients


async def kill_redis_clients(
    pids: Sequence[int], suffixes: tuple[str, ...] = ("-pubsub",), redis_url: str | None = None
) -> list[dict[str, str]]:
    """CLIENT KILL the connections that `pids` opened and named `*<suffix>` (realtime.redis
    names them `<bus name>-pubsub` and `<bus name>-cmd`).

    Connections are matched by their client port (not only by name), so other Threadline
    processes sharing this Redis are never touched. Returns the killed CLIENT LIST entries.
    """
    from redis.asyncio import Redis

    redis_url = redis_url or require_redis()
    redis_port = _redis_port(redis_url)
    ours = {port for pid in pids for port in local_ports_to(pid, redis_port)}
    client = Redis.from_url(redis_url)
    try:
        listing = await client.execute_command("CLIENT", "LIST")
        text = listing.decode() if isinstance(listing, bytes) else str(listing)
        victims = [
            entry
            for entry in parse_client_list(text)
            if entry.get("name", "").endswith(suffixes)
            and int(entry.get("addr", ":0").rsplit(":", 1)[1]) in ours
        ]
        for entry in victims:
            await client.execute_command("CLIENT", "KILL", "ID", entry["id"])
        return victims
    finally:
        await client.aclose()
