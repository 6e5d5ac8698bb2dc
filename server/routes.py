"""HTTP routes of the public API: thin adapters from JSON bodies onto ThreadService commands."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from runtime.errors import InvalidInput, TooLarge
from runtime.models import Principal, Thread, WaitKind
from runtime.service import ThreadService
from server.answers import admission_answer, regenerate_answer, stop_answer, version_answer
from server.auth import authenticate, bearer_token, require_trusted
from server.bodies import (
    CreateThreadBody,
    EmptyBody,
    RegenerateBody,
    ResumeBody,
    SendMessageBody,
    ToolResultBody,
    VisibilityBody,
)
from server.errors import InvalidJSON, response_for
from server.responses import JSONResponse

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
B = TypeVar("B", bound=BaseModel)
Handler = Callable[[Request, Principal], Awaitable[Response]]


def service_of(request: Request) -> ThreadService:
    service: ThreadService = request.app.state.service
    return service


def authenticated(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Authenticate, run the handler, and turn every failure into a JSON error response."""

    @wraps(handler)
    async def endpoint(request: Request) -> Response:
        try:
            principal = await authenticate(
                request.app.state.store, bearer_token(request.headers)
            )
            return await handler(request, principal)
        except HTTPException:
            raise  # Starlette's own HTTP errors: rendered as JSON by the app's handler
        except Exception as exc:
            return response_for(exc)

    return endpoint


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


def _thread_summary(thread: Thread) -> dict[str, Any]:
    # Private metadata never leaves the server.
    return {
        "id": thread.id,
        "scope": thread.scope,
        "title": thread.title,
        "version": thread.version,
        "metadata": thread.metadata,
        "created_at": thread.created_at,
        "updated_at": thread.updated_at,
    }


def _flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name, "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise InvalidInput(f"query parameter {name!r} must be true or false")
    return value in ("true", "1")


# --- threads ------------------------------------------------------------------------------


@authenticated
async def create_thread(request: Request, principal: Principal) -> Response:
    body = await parse_body(request, CreateThreadBody)
    body.check_limits()
    snapshot = await service_of(request).create_thread(
        principal, title=body.title, metadata=body.metadata, scope=body.scope
    )
    return JSONResponse(snapshot.to_wire(), status_code=201)


@authenticated
async def list_threads(request: Request, principal: Principal) -> Response:
    raw_limit = request.query_params.get("limit", "100")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 500:
        raise InvalidInput("query parameter 'limit' must be an integer from 1 to 500")
    threads = await service_of(request).list_threads(principal, int(raw_limit))
    return JSONResponse({"threads": [_thread_summary(t) for t in threads]})


@authenticated
async def get_snapshot(request: Request, principal: Principal) -> Response:
    thread_id = request.path_params["thread_id"]
    snapshot = await service_of(request).snapshot(
        principal, thread_id, include_hidden=_flag(request, "include_hidden")
    )
    return JSONResponse(snapshot.to_wire())


# --- input ------------------------------------------------------------------------------


@authenticated
async def send_message(request: Request, principal: Principal) -> Response:
    body = await parse_body(request, SendMessageBody)
    body.check_limits()
    admission = await service_of(request).send_message(
        principal,
        request.path_params["thread_id"],
        body.text,
        client_request_id=body.client_request_id,
        policy=body.policy,
        client_tools=[tool.model_dump() for tool in body.client_tools],
    )
    return JSONResponse(admission_answer(admission), status_code=202)


@authenticated
async def cancel_queued(request: Request, principal: Principal) -> Response:
    thread_id = request.path_params["thread_id"]
    version = await service_of(request).cancel_queued(
        principal, thread_id, request.path_params["item_id"]
    )
    return JSONResponse({"thread_id": thread_id, "version": version})


# --- pending actions --------------------------------------------------------------------


@authenticated
async def resume_action(request: Request, principal: Principal) -> Response:
    body = await parse_body(request, ResumeBody)
    result = await service_of(request).resume_action(
        principal,
        request.path_params["thread_id"],
        request.path_params["action_id"],
        body.payload,
        expected_version=body.expected_version,
    )
    return JSONResponse(version_answer(result))


@authenticated
async def client_result(request: Request, principal: Principal) -> Response:
    return await _tool_result(request, principal, WaitKind.CLIENT_TOOL)


@authenticated
async def manual_result(request: Request, principal: Principal) -> Response:
    require_trusted(principal)
    return await _tool_result(request, principal, WaitKind.MANUAL_RESULT)


async def _tool_result(request: Request, principal: Principal, kind: WaitKind) -> Response:
    body = await parse_body(request, ToolResultBody)
    result = await service_of(request).resume_action(
        principal,
        request.path_params["thread_id"],
        request.path_params["action_id"],
        body.payload(),
        expected_version=body.expected_version,
        kind=kind,
    )
    return JSONResponse(version_answer(result))


# --- runs and history -------------------------------------------------------------------


@authenticated
async def stop_run(request: Request, principal: Principal) -> Response:
    await parse_body(request, EmptyBody)
    result = await service_of(request).stop_run(
        principal, request.path_params["thread_id"], request.path_params["run_id"]
    )
    return JSONResponse(stop_answer(result), status_code=202)


@authenticated
async def regenerate(request: Request, principal: Principal) -> Response:
    body = await parse_body(request, RegenerateBody)
    result = await service_of(request).regenerate(
        principal, request.path_params["thread_id"], body.message_id
    )
    return JSONResponse(regenerate_answer(result), status_code=202)


@authenticated
async def set_visibility(request: Request, principal: Principal) -> Response:
    body = await parse_body(request, VisibilityBody)
    result = await service_of(request).set_visibility(
        principal,
        request.path_params["thread_id"],
        request.path_params["message_id"],
        body.visibility,
    )
    return JSONResponse(version_answer(result))


# --- misc -------------------------------------------------------------------------------


@authenticated
async def me(request: Request, principal: Principal) -> Response:
    return JSONResponse(
        {"subject": principal.subject, "role": principal.role, "scopes": sorted(principal.scopes)}
    )


async def healthz(request: Request) -> Response:
    settings = request.app.state.settings
    bus = getattr(request.app.state, "bus", None)
    healthy = bool(getattr(bus, "healthy", True)) if bus is not None else None
    return JSONResponse({"status": "ok", "role": settings.role, "bus_healthy": healthy})


async def index(request: Request) -> Response:
    page = STATIC_DIR / "index.html"
    if not page.is_file():
        raise HTTPException(404)
    return FileResponse(page, media_type="text/html")


T = "/v1/threads/{thread_id}"


def api_routes() -> list[BaseRoute]:
    """Every authenticated route; each one under /v1/threads/{thread_id} is scope-checked."""
    return [
        Route("/v1/threads", create_thread, methods=["POST"], name="create_thread"),
        Route("/v1/threads", list_threads, methods=["GET"], name="list_threads"),
        Route(T, get_snapshot, methods=["GET"], name="snapshot"),
        Route(f"{T}/messages", send_message, methods=["POST"], name="send_message"),
        Route(
            f"{T}/messages/{{message_id}}/visibility",
            set_visibility,
            methods=["POST"],
            name="set_visibility",
        ),
        Route(f"{T}/queue/{{item_id}}", cancel_queued, methods=["DELETE"], name="cancel_queued"),
        Route(
            f"{T}/actions/{{action_id}}/resume", resume_action, methods=["POST"], name="resume"
        ),
        Route(
            f"{T}/actions/{{action_id}}/client-result",
            client_result,
            methods=["POST"],
            name="client_result",
        ),
        Route(
            f"{T}/actions/{{action_id}}/manual-result",
            manual_result,
            methods=["POST"],
            name="manual_result",
        ),
        Route(f"{T}/runs/{{run_id}}/stop", stop_run, methods=["POST"], name="stop_run"),
        Route(f"{T}/regenerate", regenerate, methods=["POST"], name="regenerate"),
        Route("/v1/me", me, methods=["GET"], name="me"),
    ]


def health_routes() -> list[BaseRoute]:
    return [Route("/healthz", healthz, methods=["GET"], name="healthz")]


def static_routes() -> list[BaseRoute]:
    return [
        Route("/", index, methods=["GET"], name="index"),
        Mount("/static", StaticFiles(directory=STATIC_DIR, check_dir=False), name="static"),
    ]
