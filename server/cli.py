"""The `threadline` command: serve, token create, list and revoke, migrate, config, schedules,
webhooks and audit verify."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import click
import orjson

from runtime.domain import Role
from runtime.errors import InvalidInput
from server.config_check import BadSettings, effective, load_settings
from server.hooks_cli import schedule, webhook
from server.logs import setup_logging, uvicorn_log_config
from server.settings import Settings

log = logging.getLogger("threadline")
# The exit status of a command refused for its settings (click's own usage errors use 2 too).
BAD_SETTINGS = 2


def _settings(**overrides: Any) -> Settings:
    """The validated settings; each invalid value is one line on stderr, then exit 2."""
    try:
        settings, warnings = load_settings(**overrides)
    except BadSettings as exc:
        for warning in exc.warnings:
            click.echo(f"threadline: warning: {warning}", err=True)
        for line in exc.lines:
            click.echo(f"threadline: invalid setting {line}", err=True)
        raise SystemExit(BAD_SETTINGS) from None
    for warning in warnings:
        click.echo(f"threadline: warning: {warning}", err=True)
    return settings


def _check_policies(settings: Settings) -> None:
    """THREADLINE_APPROVAL_POLICIES against the agent's tools, before anything starts: a name
    that is no approval tool (or a payload the tool refuses) is one line, then exit 2."""
    if settings.approval_policies is None:
        return
    from runtime.agent import load_agent
    from runtime.approval_overrides import apply_policies

    try:
        apply_policies(load_agent(settings.agent), settings.policy_overrides)
    except ValueError as exc:
        click.echo(f"threadline: invalid setting {exc}", err=True)
        raise SystemExit(BAD_SETTINGS) from None


@asynccontextmanager
async def _migrated_store(settings: Settings) -> AsyncIterator[Any]:
    from server.app import open_storage

    async with AsyncExitStack() as stack:
        yield await open_storage(settings.database_url, stack)


async def _create_token(
    settings: Settings,
    subject: str,
    role: Role,
    scopes: Sequence[str],
    expires_in: float | None = None,
    display_name: str | None = None,
    groups: Sequence[str] = (),
) -> str:
    from server.auth import create_token

    async with _migrated_store(settings) as store:
        return await create_token(
            store,
            subject=subject,
            role=role,
            scopes=scopes,
            expires_in=expires_in,
            display_name=display_name,
            groups=groups,
        )


async def _revoke_token(
    settings: Settings, token: str | None, token_id: str | None = None
) -> tuple[bool, bool]:
    """(revoked, published): revoke in storage (the token, or the one `token_id` names), then
    tell the gateways over the bus."""
    from realtime import connect_bus, open_bus
    from server.auth import hash_token, token_key_of_hash
    from server.live.revocation import publish_revoked

    async with _migrated_store(settings) as store:
        token_hash = hash_token(token) if token else await store.token_hash_of_id(token_id or "")
        if token_hash is None or not await store.revoke_token(token_hash):
            return False, False
    if not settings.redis_url:
        return True, False  # an embedded server's gateway notices on its periodic check
    bus = open_bus(settings.redis_url, prefix=settings.redis_prefix)
    try:
        await connect_bus(bus, timeout=min(settings.bus_connect_timeout, 5.0))
        return True, await publish_revoked(bus, token_key_of_hash(token_hash))
    except Exception as exc:
        log.warning("revoked in storage, but could not reach Redis: %s", exc)
        return True, False
    finally:
        await bus.close()


async def _migrate(settings: Settings) -> list[str]:
    """The names of the migrations applied now (none when storage was up to date)."""
    from runtime.storage import open_store

    store = open_store(settings.database_url)
    await store.open()
    try:
        return list(store.migrated)  # open() applies what is pending
    finally:
        await store.close()


def _browser_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


@click.group()
@click.version_option(package_name="threadline", prog_name="threadline")
def main() -> None:
    """Threadline: a self-hostable realtime server for AI agent conversations."""


@main.command()
@click.option("--host", default=None, help="Interface to bind (THREADLINE_HOST).")
@click.option("--port", type=int, default=None, help="Port to bind (THREADLINE_PORT).")
@click.option(
    "--role",
    type=click.Choice(["all", "gateway", "worker"]),
    default=None,
    help="all: gateway and worker in one process (THREADLINE_ROLE).",
)
def serve(host: str | None, port: int | None, role: str | None) -> None:
    """Run the server (gateway, worker, or both)."""
    from server import drain
    from server.app import create_app
    from server.transports.uvicorn_http import connection_limit, http_protocol
    from server.transports.ws.uvicorn_ws import WebSocketProtocol

    overrides = {k: v for k, v in {"host": host, "port": port, "role": role}.items() if v}
    settings = _settings(**overrides)
    _check_policies(settings)
    setup_logging(settings.log_level, settings.log_format)
    if settings.redis_url is None and settings.role != "all":
        log.warning(
            "role=%s without THREADLINE_REDIS_URL: the in-process bus reaches no other process",
            settings.role,
        )
    if settings.dev_token and settings.runs_gateway:
        token = asyncio.run(_create_token(settings, "dev", Role.USER, [settings.dev_scope]))
        # In the fragment, which browsers never send: the token is in no request line.
        url = f"http://{_browser_host(settings.host)}:{settings.port}/#token={token}"
        click.echo(f"Threadline is starting. Open {url}")
    app = create_app(settings)
    app.state.tune_gc = True  # once started: gc.freeze() and the rest (server/gc_tuning.py)
    # uvicorn.run, with the app's event streams drained when shutdown starts (server/drain.py).
    drain.run(
        app,
        app.state.drain,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=uvicorn_log_config(settings.log_format, settings.log_level),
        loop=settings.event_loop,
        # The app closes oversize frames with 1009 itself; uvicorn's bound (same code) only
        # guards memory against frames far beyond it.
        ws_max_size=settings.ws_max_frame_bytes * 4,
        ws_ping_interval=settings.ws_ping_interval,
        ws_ping_timeout=settings.ws_ping_timeout,
        ws_per_message_deflate=settings.ws_per_message_deflate,
        # uvicorn's sans-I/O websockets protocol plus a synchronous send
        # (server/transports/ws/uvicorn_ws.py).
        ws=WebSocketProtocol,
        # Idle, slow and too many connections (server/transports/uvicorn_http.py).
        http=http_protocol(settings.http_header_timeout, settings.http_body_timeout),
        timeout_keep_alive=settings.http_keep_alive_timeout,
        limit_concurrency=connection_limit(settings.max_connections),
        # Streams end with a final event at once; this bounds what is still open after it.
        timeout_graceful_shutdown=settings.shutdown_grace,
    )


@main.group()
def token() -> None:
    """Bearer tokens."""


@token.command("create")
@click.option("--scope", "scopes", multiple=True, required=True, help="Scope (repeatable).")
@click.option(
    "--role", type=click.Choice([r.value for r in Role]), default=Role.USER.value, show_default=True
)
@click.option("--subject", default=None, help="Who the token acts as (default: '<role>-cli').")
@click.option(
    "--expires-in", type=click.FloatRange(min=1), default=None, help="Seconds until it expires."
)
@click.option(
    "--name",
    "display_name",
    default=None,
    help="Display name others see (presence, 'reviewing'); default: the subject. 1-64 chars.",
)
@click.option(
    "--group",
    "groups",
    multiple=True,
    help="A group the holder is in, as approval policies route by (repeatable).",
)
def token_create(
    scopes: tuple[str, ...],
    role: str,
    subject: str | None,
    expires_in: float | None,
    display_name: str | None,
    groups: tuple[str, ...],
) -> None:
    """Print one new bearer token on stdout (nothing else)."""
    settings = _settings()
    setup_logging("warning")
    try:
        value = asyncio.run(
            _create_token(
                settings,
                subject or f"{role}-cli",
                Role(role),
                list(scopes),
                expires_in,
                display_name,
                list(groups),
            )
        )
    except InvalidInput as exc:
        hint = "--group" if "group" in str(exc) else "--name"
        raise click.BadParameter(str(exc), param_hint=hint) from exc
    click.echo(value)


async def _list_tokens(settings: Settings) -> list[Any]:
    async with _migrated_store(settings) as store:
        tokens: list[Any] = await store.list_tokens()
        return tokens


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@token.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def token_list(as_json: bool) -> None:
    """List active tokens: id, subject, role, scopes, groups, name, created, expires, last used
    (never the token itself: only its hash is stored, and the id is a prefix of that)."""
    settings = _settings()
    setup_logging("warning")
    tokens = asyncio.run(_list_tokens(settings))
    if as_json:
        for info in tokens:
            click.echo(info.model_dump_json())
        return
    rows = [
        ("ID", "SUBJECT", "ROLE", "SCOPES", "GROUPS", "NAME", "CREATED", "EXPIRES", "LAST USED")
    ]
    rows += [
        (
            info.id,
            info.subject,
            info.role.value,
            ",".join(info.scopes),
            ",".join(info.groups) or "-",
            info.name or "-",
            _when(info.created_at),
            _when(info.expires_at),
            _when(info.last_used_at),
        )
        for info in tokens
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


@token.command("revoke")
@click.argument("token_value", metavar="[TOKEN]", required=False)
@click.option("--id", "token_id", default=None, help="The token's id (`token list`) instead.")
def token_revoke(token_value: str | None, token_id: str | None) -> None:
    """Revoke TOKEN (or the token --id names): refused from now on, its open websockets closed
    (4403) on every gateway."""
    if (token_value is None) == (token_id is None):
        raise click.UsageError("give either TOKEN or --id, not both")
    settings = _settings()
    setup_logging("warning")
    token = token_value.strip() if token_value else None
    revoked, published = asyncio.run(_revoke_token(settings, token, token_id))
    if not revoked:
        raise click.ClickException("no such active token")
    how = "gateways told over Redis" if published else "gateways notice within 5 s"
    click.echo(f"revoked ({how})", err=True)


@main.command()
def migrate() -> None:
    """Apply storage migrations, print each one applied, and exit."""
    settings = _settings()
    setup_logging("warning")
    applied = asyncio.run(_migrate(settings))
    for name in applied:
        click.echo(f"applied {name}")
    click.echo(f"applied {len(applied)} migrations" if applied else "storage is up to date")


@main.command("config")
def config_command() -> None:
    """Print the effective settings (environment, .env file, defaults), secrets masked."""
    settings = _settings()
    for name, value in effective(settings):
        shown = "" if value is None else value
        if isinstance(value, bool):
            shown = str(value).lower()
        elif isinstance(value, list | dict):
            shown = orjson.dumps(value).decode()
        click.echo(f"{name}={shown}")


@main.group()
def audit() -> None:
    """The audit log of approvals (docs/operations.md, "Approvals and the audit log")."""


# The exit status of `audit verify` when the chain is broken.
CHAIN_BROKEN = 1


@audit.command("verify")
@click.option("--scope", required=True, help="The scope whose chain to check.")
def audit_verify(scope: str) -> None:
    """Check a scope's hash chain: exit 0 with a summary when it holds, 1 naming the first
    broken entry when a row was edited or deleted."""
    from runtime.service.audit import verify_scope
    from runtime.storage.sql.audit_sql import SqlAuditLog

    settings = _settings()

    async def check() -> Any:
        async with _migrated_store(settings) as store:
            return await verify_scope(SqlAuditLog(store), scope)

    report = asyncio.run(check())
    if report.ok:
        click.echo(f"audit chain of scope {scope}: {report.entries} entries, intact")
        return
    click.echo(f"audit chain of scope {scope} is broken at {report.problem}", err=True)
    raise SystemExit(CHAIN_BROKEN)


@main.group()
def retention() -> None:
    """Thread retention (docs/operations.md, "Thread retention")."""


# A bound on one `retention run`: batches of RETENTION_BATCH threads, far beyond any deployment.
RETENTION_ROUNDS = 100_000


@retention.command("run")
@click.option(
    "--older-than",
    "older_than",
    default=None,
    help="Delete threads idle longer than this (30d, 12h, seconds); default: "
    "THREADLINE_THREAD_RETENTION.",
)
def retention_run(older_than: str | None) -> None:
    """Delete the threads idle longer than the retention, now, in batches (for cron; the
    workers' timer does the same every THREADLINE_THREAD_RETENTION_INTERVAL). A thread with a
    live run, pending action, active schedule or held lease is kept."""
    from runtime.storage.retention import RETENTION_BATCH, parse_duration
    from runtime.storage.sql.hooks_sql import SqlHooks

    settings = _settings()
    try:
        idle_for = parse_duration(older_than) if older_than else settings.thread_retention
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    if idle_for is None:
        raise click.UsageError("no retention: pass --older-than or set THREADLINE_THREAD_RETENTION")

    async def expire() -> int:
        async with _migrated_store(settings) as store:
            hooks = SqlHooks(store)
            cutoff = await store.db_time() - idle_for
            total = 0
            for _ in range(RETENTION_ROUNDS):
                deleted = await hooks.expire_threads(cutoff, RETENTION_BATCH)
                total += len(deleted)
                if len(deleted) < RETENTION_BATCH:
                    break
            return total

    total = asyncio.run(expire())
    click.echo(f"retention: deleted {total} threads idle longer than {idle_for:g}s")


main.add_command(schedule)
main.add_command(webhook)

if __name__ == "__main__":
    main()
