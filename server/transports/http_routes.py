"""HTTP routes: a generic endpoint per command of the table, health, and the browser client."""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, create_model
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from runtime import log_context
from runtime.domain import Origin
from runtime.errors import InvalidInput, TooLarge
from runtime.service.thread_service import ThreadService
from server.auth import authenticate, bearer_token, token_key
from server.live.snapshot_cache import etag_matches
from server.protocol.command_model import Caller, Command
from server.protocol.commands import COMMANDS
from server.protocol.inputs import Input
from server.protocol.responses import JSONResponse
from server.protocol.wire_errors import InvalidJSON, wire_error
from server.transports.readiness import readyz

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
B = TypeVar("B", bound=BaseModel)
Endpoint = Callable[[Request], Awaitable[Response]]


def service_of(request: Request) -> ThreadService:
    service: ThreadService = request.app.state.service
    return service


# The event-stream adapters' routes, named in the audit log's `transport` (others: `http`).
_SSE_PREFIXES = (("/v1/ag-ui", "ag-ui"), ("/v1/ai-sdk/", "ai-sdk"))


def _transport_of(path: str) -> str:
    return next((name for prefix, name in _SSE_PREFIXES if path.startswith(prefix)), "http")


async def request_caller(request: Request) -> Caller:
    """The authenticated caller of an HTTP request (raises `Unauthorized`), with the quotas and
    token administration of the app: every HTTP transport (routes, event streams) builds it so."""
    headers = request.headers
    token = bearer_token(headers)
    state = request.app.state
    principal = await authenticate(state.store, token)
    key = token_key(token or "")  # hashed once: it names the token in quotas and the audit
    client = request.client
    return Caller(
        principal,
        state.service,
        limiter=getattr(state, "limiter", None),
        token_id=key,
        revoker=getattr(state, "revoker", None),
        snapshots=getattr(state, "snapshots", None),
        deltas=getattr(state, "deltas", None),
        origin=Origin(
            # The scope's path is what `request.url.path` parses out of a whole URL.
            transport=_transport_of(request.scope["path"]),
            client_address=client.host if client else None,
            user_agent=headers.get("user-agent"),
            token_id=key,
        ),
    )


async def read_body(request: Request) -> bytes:
    """The request body, refused with `too_large` beyond the configured limit."""
    limit: int = request.app.state.settings.http_max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the request body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the request body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_body(request: Request, model: type[B]) -> B:
    raw = await read_body(request)
    data: Any = {}
    if raw.strip():
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidJSON(f"the request body is not valid JSON: {exc.msg}") from exc
    try:
        return model.model_validate(data)
    except RecursionError as exc:
        # orjson parses up to 1024 levels; validating that deep exhausts Python's stack.
        raise InvalidInput("the request body is nested too deeply") from exc


def body_model(command: Command[Any, Any]) -> type[BaseModel] | None:
    """The command's input model without the fields its path (or query) provides."""
    http = command.http
    if http is None or not http.body:
        return None
    fields: dict[str, Any] = {
        name: (info.annotation, info)
        for name, info in command.input.model_fields.items()
        if name not in http.path_fields
    }
    # Based on Input, so the checks every command field gets (no NUL, bounded nesting) hold
    # for HTTP bodies as for websocket frames.
    model: type[BaseModel] = create_model(
        f"{command.input.__name__}Body",
        __base__=Input,
        __module__=__name__,
        **fields,
    )
    return model


def command_endpoint(command: Command[Any, Any]) -> Endpoint:
    """Authenticate, authorize, read path, query and body into the input, run, answer in JSON.

    Each step may refuse, in this order; every failure becomes a JSON error response.
    """
    http = command.http
    assert http is not None
    body = body_model(command)

    async def endpoint(request: Request) -> Response:
        log_context.bind_task(thread_id=request.path_params.get("thread_id"))
        try:
            caller = await request_caller(request)
            if command.authorize is not None:
                command.authorize(caller.principal)
            fields: dict[str, Any] = dict(request.path_params)
            if http.query is not None:
                fields.update(http.query(request.query_params))
            if body is not None:
                parsed = await parse_body(request, body)
                fields.update((name, getattr(parsed, name)) for name in parsed.model_fields_set)
            # Path and query fields are validated like the body: one answer for one bad id on
            # every transport (a NUL in a path id is `invalid_input`, as in a frame).
            data = command.parse(caller, fields)
            if http.etag is None:
                return JSONResponse(await command.run(caller, data), status_code=http.status)
            result = await command.result(caller, data)
            tag = http.etag(caller.principal, result)
            # Private: the tag and the body are one viewer's; revalidated on every use.
            headers = {"ETag": tag, "Cache-Control": "private, no-cache"}
            if etag_matches(request.headers.get("if-none-match"), tag):
                return Response(status_code=304, headers=headers)
            answer = command.answer(data, result)
            return JSONResponse(answer, status_code=http.status, headers=headers)
        except HTTPException:
            raise  # Starlette's own HTTP errors: rendered as JSON by the app's handler
        except Exception as exc:
            return wire_error(exc, invalid="the request is invalid").response()

    endpoint.__name__ = http.route
    # Read by the protocol tests: what this route really runs and validates.
    endpoint.command = command  # type: ignore[attr-defined]
    endpoint.body_model = body  # type: ignore[attr-defined]
    return endpoint


async def healthz(request: Request) -> Response:
    settings = request.app.state.settings
    bus = getattr(request.app.state, "bus", None)
    healthy = bool(getattr(bus, "healthy", True)) if bus is not None else None
    return JSONResponse({"status": "ok", "role": settings.role, "bus_healthy": healthy})


async def index(request: Request) -> Response:
    page = STATIC_DIR / "index.html"
    if not page.is_file():
        raise HTTPException(404)
    sign_in = request.app.state.settings.oidc_browser
    if sign_in is None:
        return FileResponse(page, media_type="text/html")
    # The browser sign-in's public settings, for static/js/oidc.js (docs/operations.md,
    # "Browser sign-in"): in the page, so it needs no request before signing in.
    content = html.escape(sign_in.model_dump_json(), quote=True)
    meta = f'<meta name="threadline-oidc" content="{content}">'
    text = page.read_text(encoding="utf-8").replace("</head>", f"  {meta}\n</head>", 1)
    return Response(text, media_type="text/html")


def api_routes() -> list[BaseRoute]:
    """A route per HTTP command; each one under /v1/threads/{thread_id} is scope-checked."""
    return [
        Route(c.http.path, command_endpoint(c), methods=[c.http.method], name=c.http.route)
        for c in COMMANDS
        if c.http is not None
    ]


def health_routes() -> list[BaseRoute]:
    return [
        Route("/healthz", healthz, methods=["GET"], name="healthz"),
        Route("/readyz", readyz, methods=["GET"], name="readyz"),
    ]


def static_routes() -> list[BaseRoute]:
    return [
        Route("/", index, methods=["GET"], name="index"),
        Mount("/static", StaticFiles(directory=STATIC_DIR, check_dir=False), name="static"),
    ]
