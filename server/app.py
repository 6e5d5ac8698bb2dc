"""The ASGI app factory and its lifespan: open components in order, close them in reverse."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import BaseRoute, Route, WebSocketRoute

from realtime import connect_bus, open_bus
from realtime.counters import open_counters
from realtime.hub import Hub
from runtime.agent import load_agent
from runtime.approval_overrides import apply_policies
from runtime.authorization import load_authorize_hook
from runtime.engine.publisher import Publisher
from runtime.engine.worker import Worker
from runtime.errors import ThreadlineError
from runtime.hooks.delivery import DeliveryPolicy, DeliveryWorker
from runtime.hooks.hooks_service import HooksService, register_hooks
from runtime.hooks.outbound import parse_networks
from runtime.hooks.timer_loop import TimerLoop
from runtime.service.audit import AuditService, register_audit
from runtime.service.thread_service import ThreadService
from runtime.storage import open_store
from runtime.storage.scope_cache import ScopeCache
from runtime.storage.sql.audit_sql import SqlAuditLog
from runtime.storage.sql.hooks_sql import SqlHooks
from server.auth import cache_principals, forget_principal, trust_issuers
from server.auth_cache import PrincipalCache
from server.drain import Drain
from server.gc_tuning import tune_gc
from server.live.inbox import ActionInbox
from server.live.presence import PresenceHub, open_presence
from server.live.quotas import Limiter, admission_limits
from server.live.revocation import TokenRevoker, listen_revocations
from server.live.snapshot_cache import SnapshotCache
from server.live.snapshot_deltas import SnapshotDeltas
from server.logs import RequestIds
from server.metrics import metrics_endpoint, metrics_server
from server.oidc import Issuers
from server.protocol.wire_errors import handle_error
from server.settings import Settings
from server.tracing import HttpTelemetry, configure_telemetry
from server.transports.http_routes import api_routes, health_routes, static_routes
from server.transports.openapi import openapi_endpoint
from server.transports.sse.agui import agui_routes
from server.transports.sse.aisdk import aisdk_routes
from server.transports.ws.gateway import Gateway, WebSocketDispatch, websocket_endpoint

log = logging.getLogger(__name__)


async def open_storage(url: str, stack: AsyncExitStack) -> Any:
    """Open the store for `url`, register its closing on `stack`, apply migrations."""
    store = open_store(url)
    await store.open()
    stack.push_async_callback(store.close)
    applied = [*getattr(store, "migrated", ()), *await store.migrate()]
    if applied:
        log.info("applied migrations: %s", ", ".join(map(str, applied)))
    return store


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    state = app.state
    async with AsyncExitStack() as stack:
        telemetry = configure_telemetry(prometheus=settings.metrics_enabled)
        stack.push_async_callback(telemetry.shutdown)
        state.telemetry = telemetry

        state.store = await open_storage(settings.database_url, stack)
        if settings.oidc_issuers:
            issuers = await stack.enter_async_context(
                Issuers(
                    settings.oidc_issuers,
                    leeway=settings.oidc_leeway,
                    max_age=settings.oidc_jwks_max_age,
                    min_refresh=settings.oidc_jwks_min_refresh,
                )
            )
            trust_issuers(state.store, issuers)
            stack.callback(trust_issuers, state.store, None)
        if settings.metrics_enabled and settings.metrics_port is not None:
            await stack.enter_async_context(
                metrics_server(state, settings.host, settings.metrics_port)
            )

        bus = open_bus(settings.redis_url, prefix=settings.redis_prefix)
        await connect_bus(bus, timeout=settings.bus_connect_timeout)
        stack.push_async_callback(bus.close)
        state.bus = bus
        scopes = ScopeCache(state.store)
        state.publisher = Publisher(bus, scope_of=scopes.scope_of, remember_scope=scopes.remember)
        stack.push_async_callback(state.publisher.close)

        agent = apply_policies(load_agent(settings.agent), settings.policy_overrides)
        state.agent = agent
        state.service = ThreadService(
            state.store,
            state.publisher,
            agent,
            limits=admission_limits(settings),
            permissions=settings.permissions,
            snapshot_messages=settings.snapshot_messages,
            queue_preview_chars=settings.queue_preview_chars,
            authorize_hook=None
            if settings.authorize is None
            else load_authorize_hook(settings.authorize),
        )
        state.hooks_store = SqlHooks(
            state.store,
            schedules_per_scope=settings.schedules_per_scope,
            webhooks_per_scope=settings.webhooks_per_scope,
        )
        allow = parse_networks(settings.webhook_allow_networks)
        register_hooks(state.service, HooksService(state.hooks_store, allow=allow))
        register_audit(state.service, AuditService(state.service, SqlAuditLog(state.store)))
        counters = open_counters(settings.redis_url, settings.counters_prefix)
        stack.push_async_callback(counters.close)
        state.limiter = Limiter(settings, counters)
        state.revoker = TokenRevoker(state.store, bus)

        state.hub = None
        state.snapshots = None
        state.deltas = None
        state.gateway = None
        if settings.runs_gateway:
            hub = Hub(
                bus,
                version_source=state.store.thread_versions,
                poll_interval=settings.poll_interval,
            )
            await stack.enter_async_context(hub)
            state.hub = hub
            state.snapshots = SnapshotCache(hub.freshness, settings.snapshot_cache)
            state.publisher.observe(state.snapshots.saw)
            inbox = ActionInbox(bus, state.store)
            stack.push_async_callback(inbox.close)
            presence = await stack.enter_async_context(
                PresenceHub(
                    bus,
                    open_presence(settings.redis_url, prefix=settings.redis_prefix),
                    refresh_interval=settings.presence_refresh,
                )
            )
            state.presence = presence
            deltas = SnapshotDeltas(
                state.snapshots,
                state.service,
                settings.snapshot_delta_max_bytes,
                capacity=max(1, settings.snapshot_cache),
            )
            stack.push_async_callback(deltas.close)
            state.deltas = deltas
            gateway = Gateway(
                settings, state.service, hub, inbox, presence, state.limiter, deltas=deltas
            )
            # Registered after the hub so connections close before the hub stops.
            stack.push_async_callback(gateway.close)
            state.gateway = gateway
            if settings.auth_cache_ttl > 0:
                # Only where revocations are heard: the listener below forgets the token.
                cache_principals(state.store, PrincipalCache(settings.auth_cache_ttl))
                stack.callback(cache_principals, state.store, None)
            store = state.store

            async def revoked(key: str) -> int:
                forget_principal(store, key)
                return await gateway.revoke(key)

            listener = asyncio.create_task(listen_revocations(bus, revoked))
            stack.push_async_callback(_cancel, listener)

        state.worker = None
        if settings.runs_worker:
            worker = Worker(
                state.store,
                bus,
                agent,
                lease_ttl=settings.lease_ttl,
                poll_interval=settings.poll_interval,
                max_concurrent_runs=settings.max_concurrent_runs,
                replay_max_bytes=settings.replay_max_bytes,
                mcp_servers=settings.mcp_servers,
            )
            await stack.enter_async_context(worker)
            state.worker = worker
            # Schedules fire and webhooks are delivered where runs are executed; so does
            # retention, whose one timer every worker sets to this process's policy.
            await state.hooks_store.set_retention(settings.retention)
            await stack.enter_async_context(
                TimerLoop(
                    state.hooks_store,
                    state.publisher,
                    limits=admission_limits(settings),
                    poll_interval=settings.timer_poll_interval,
                    lease_ttl=settings.timer_lease_ttl,
                )
            )
            await stack.enter_async_context(
                DeliveryWorker(
                    state.hooks_store,
                    DeliveryPolicy(
                        timeout=settings.webhook_timeout,
                        initial_backoff=settings.webhook_initial_backoff,
                        max_backoff=settings.webhook_max_backoff,
                        max_age=settings.webhook_max_age,
                        max_response_bytes=settings.webhook_max_response_bytes,
                        allow=allow,
                    ),
                    poll_interval=settings.webhook_poll_interval,
                )
            )

        # `threadline serve` only (not an app a test opens in its own process).
        if getattr(state, "tune_gc", False):
            gc_log = tune_gc(settings)
            if gc_log is not None:
                stack.callback(gc_log.close)
        log.info("threadline started (role=%s)", settings.role)
        yield
        log.info("threadline stopping (role=%s)", settings.role)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# What a cross-origin browser client sends: a bearer token, JSON, an event-stream Accept.
CORS_HEADERS = ["Authorization", "Content-Type", "Accept", "Last-Event-ID", "X-Request-ID"]
CORS_METHODS = ["GET", "POST", "DELETE"]


def cors_middleware(settings: Settings) -> list[Middleware]:
    """Starlette's CORS for the allowed origins (none: off). Bearer tokens, not cookies, so
    no credentials mode; error bodies carry CORS headers too, so a browser app can read them."""
    if not settings.cors_allowed_origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=settings.cors_allowed_origins,
            allow_methods=CORS_METHODS,
            allow_headers=CORS_HEADERS,
            expose_headers=["Retry-After", "WWW-Authenticate", "X-Request-ID"],
            max_age=600,
        )
    ]


def create_app(settings: Settings | None = None) -> Starlette:
    """A plain ASGI app; every component is opened by its lifespan (run it under uvicorn)."""
    settings = settings or Settings()
    routes: list[BaseRoute] = list(health_routes())
    if settings.metrics_enabled and settings.metrics_port is None:
        routes.append(Route("/metrics", metrics_endpoint, methods=["GET"], name="metrics"))
    websocket = WebSocketRoute("/v1/ws", websocket_endpoint, name="ws")
    if settings.runs_gateway:
        routes += api_routes() + agui_routes() + aisdk_routes()
        routes.append(Route("/openapi.json", openapi_endpoint, methods=["GET"], name="openapi"))
        routes.append(websocket)
        routes += static_routes()
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            HTTPException: handle_error,
            ThreadlineError: handle_error,
            Exception: handle_error,
        },
        # Body size is enforced while reading (routes.read_body) to answer in JSON. The
        # websocket route (/v1/ws) is served by WebSocketDispatch, ahead of the router.
        middleware=[
            # Outermost: the SERVER span (or the caller's trace) is current for everything
            # below, log lines included; the request metrics time the whole stack.
            Middleware(HttpTelemetry, routes=routes),
            Middleware(RequestIds),
            *cors_middleware(settings),
            *([Middleware(WebSocketDispatch, route=websocket)] if settings.runs_gateway else []),
        ],
    )
    app.state.settings = settings
    app.state.drain = Drain()
    return app
