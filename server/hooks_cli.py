"""`threadline schedule …` and `threadline webhook …`: service calls as an admin of one scope."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import click
import orjson
from pydantic import BaseModel, ValidationError

from runtime.domain import Principal, Role
from runtime.errors import ThreadlineError
from runtime.hooks.hooks_service import HooksService
from runtime.hooks.outbound import parse_networks
from runtime.storage.hooks_store import DeliveryState, WebhookEvent
from runtime.storage.sql.hooks_sql import SqlHooks
from server.logs import setup_logging
from server.protocol.hooks_inputs import CreateSchedule, CreateWebhook
from server.settings import Settings

Call = Callable[[HooksService, Principal], Awaitable[Any]]


def _print(value: Any) -> None:
    """One JSON document per result on stdout (a list prints one line per item)."""
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, tuple):  # a created webhook and its secret
            item = {**item[0].model_dump(mode="json"), "secret": item[1]}
        elif isinstance(item, BaseModel):
            item = item.model_dump(mode="json")
        if item is not None:
            sys.stdout.write(orjson.dumps(item).decode() + "\n")


def run(scope: str, call: Call) -> None:
    """Run `call` against the configured storage as `cli`, an admin of `scope` only."""
    from server.cli import _migrated_store

    settings = Settings()
    setup_logging("warning")

    async def go() -> Any:
        async with _migrated_store(settings) as store:
            hooks = SqlHooks(
                store,
                schedules_per_scope=settings.schedules_per_scope,
                webhooks_per_scope=settings.webhooks_per_scope,
            )
            service = HooksService(hooks, allow=parse_networks(settings.webhook_allow_networks))
            principal = Principal(subject="cli", role=Role.ADMIN, scopes=frozenset({scope}))
            return await call(service, principal)

    try:
        _print(asyncio.run(go()))
    except ThreadlineError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from exc
    except ValidationError as exc:
        raise click.ClickException(str(exc)) from exc


SCOPE = click.option("--scope", required=True, help="The scope it belongs to.")


@click.group()
def schedule() -> None:
    """Schedules: input sent to a thread on a cron expression or at a time."""


@schedule.command("create")
@SCOPE
@click.option("--text", required=True, help="The input each fire sends.")
@click.option("--thread", "thread_id", default=None, help="The thread it sends to.")
@click.option("--new-thread", is_flag=True, help="Create a thread per fire instead.")
@click.option("--title", default="", help="Title of the threads --new-thread creates.")
@click.option("--cron", default=None, help="Cron expression (5 fields, or 6 with seconds first).")
@click.option("--timezone", default="UTC", show_default=True)
@click.option("--at", "run_at", type=float, default=None, help="One fire, at this epoch time.")
@click.option("--missed", type=click.Choice(["run_once", "skip"]), default="run_once")
@click.option("--grace", "misfire_grace", type=float, default=60.0, show_default=True)
@click.option("--policy", type=click.Choice(["enqueue", "reject", "interrupt"]), default="enqueue")
def schedule_create(scope: str, **fields: Any) -> None:
    """Create a schedule; prints it."""
    spec = CreateSchedule(scope=scope, **fields)
    run(scope, lambda s, p: s.create_schedule(p, **spec.model_dump()))


@schedule.command("list")
@SCOPE
def schedule_list(scope: str) -> None:
    run(scope, lambda s, p: s.list_schedules(p, 500))


@schedule.command("pause")
@SCOPE
@click.argument("schedule_id")
def schedule_pause(scope: str, schedule_id: str) -> None:
    run(scope, lambda s, p: s.pause_schedule(p, schedule_id, True))


@schedule.command("resume")
@SCOPE
@click.argument("schedule_id")
def schedule_resume(scope: str, schedule_id: str) -> None:
    run(scope, lambda s, p: s.pause_schedule(p, schedule_id, False))


@schedule.command("delete")
@SCOPE
@click.argument("schedule_id")
def schedule_delete(scope: str, schedule_id: str) -> None:
    run(scope, lambda s, p: s.delete_schedule(p, schedule_id))


@schedule.command("fires")
@SCOPE
@click.argument("schedule_id")
def schedule_fires(scope: str, schedule_id: str) -> None:
    run(scope, lambda s, p: s.schedule_fires(p, schedule_id, 500))


@click.group()
def webhook() -> None:
    """Webhook subscriptions, their deliveries and dead letters."""


@webhook.command("create")
@SCOPE
@click.option("--url", required=True)
@click.option(
    "--event",
    "events",
    multiple=True,
    type=click.Choice([e.value for e in WebhookEvent]),
    help="Event type (repeatable); default: all but message.committed.",
)
@click.option("--secret", default=None, help="whsec_… (default: generated, printed once).")
@click.option("--disabled", is_flag=True)
def webhook_create(
    scope: str, url: str, events: tuple[str, ...], secret: str | None, disabled: bool
) -> None:
    """Create a subscription; prints it with its secret (the only time the secret is shown)."""
    made = CreateWebhook(
        scope=scope, url=url, events=list(events) or None, secret=secret, enabled=not disabled
    )
    run(
        scope,
        lambda s, p: s.create_webhook(
            p,
            url=made.url,
            events=made.events,
            secret=made.secret,
            enabled=made.enabled,
            scope=scope,
        ),
    )


@webhook.command("list")
@SCOPE
def webhook_list(scope: str) -> None:
    run(scope, lambda s, p: s.list_webhooks(p, 500))


@webhook.command("enable")
@SCOPE
@click.argument("webhook_id")
def webhook_enable(scope: str, webhook_id: str) -> None:
    run(scope, lambda s, p: s.update_webhook(p, webhook_id, enabled=True, url=None, events=None))


@webhook.command("disable")
@SCOPE
@click.argument("webhook_id")
def webhook_disable(scope: str, webhook_id: str) -> None:
    run(scope, lambda s, p: s.update_webhook(p, webhook_id, enabled=False, url=None, events=None))


@webhook.command("delete")
@SCOPE
@click.argument("webhook_id")
def webhook_delete(scope: str, webhook_id: str) -> None:
    run(scope, lambda s, p: s.delete_webhook(p, webhook_id))


@webhook.command("deliveries")
@SCOPE
@click.argument("webhook_id")
@click.option("--state", type=click.Choice([s.value for s in DeliveryState]), default=None)
def webhook_deliveries(scope: str, webhook_id: str, state: str | None) -> None:
    wanted = None if state is None else DeliveryState(state)
    run(scope, lambda s, p: s.deliveries(p, webhook_id, wanted, 500))


@webhook.command("attempts")
@SCOPE
@click.argument("delivery_id")
def webhook_attempts(scope: str, delivery_id: str) -> None:
    run(scope, lambda s, p: s.attempts(p, delivery_id))


@webhook.command("redeliver")
@SCOPE
@click.argument("delivery_id")
def webhook_redeliver(scope: str, delivery_id: str) -> None:
    """Make a dead (or delivered) delivery pending again, with the same webhook-id."""
    run(scope, lambda s, p: s.redeliver(p, delivery_id))


__all__ = ["schedule", "webhook"]
