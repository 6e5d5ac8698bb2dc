"""`/openapi.json`: an OpenAPI 3.1 document generated from the command table."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from server.auth_errors import CODES as TOKEN_CODES
from server.protocol.command_model import Command
from server.protocol.commands import COMMANDS
from server.protocol.responses import JSONResponse
from server.protocol.wire_errors import STATUS
from server.transports.http_routes import body_model

# Codes every authenticated route may answer, and those only limited commands (writes) add.
_ANY_ROUTE = (
    "bad_request",
    "invalid_json",
    "unauthorized",
    "forbidden",
    "forbidden_by_policy",  # a deployment's authorization hook (docs/authorization.md)
    "not_found",
    "method_not_allowed",
    "too_large",
    "invalid_input",
    "unavailable",
)
_WRITES = (
    "invalid_payload",
    "conflict",
    "run_active",
    "run_stopping",
    "illegal_transition",
    "invariant_violation",
    "token_rate_limited",
    "scope_rate_limited",
    "queue_full",
    "scope_runs_exceeded",
)
# What deciding an approval under a policy may also answer (docs/protocol.md, "Approvals").
_DECISIONS = ("requester_excluded", "not_a_decider", "already_decided")
# What reassigning one may answer ("Approval policies", reassignment).
_REASSIGNS = ("requester_excluded", "not_a_decider", "delegation_not_allowed")
# Routes outside the command table: probes and metrics, no token.
_PROBES = {
    "/healthz": ("healthz", "Liveness: the process answers.", {"200": "`{status, role, ...}`"}),
    "/readyz": (
        "readyz",
        "Readiness: storage reachable, migrations current, bus answering.",
        {"200": "`{status: ready, role}`", "503": "`{status: unavailable, reasons: {...}}`"},
    ),
    "/metrics": ("metrics", "Prometheus text exposition format.", {"200": "metrics"}),
}


def error_codes(command: Command[Any, Any]) -> list[str]:
    """The error codes a command's route may answer (docs/protocol.md, "Errors")."""
    refused_tokens = [code for code in TOKEN_CODES if code not in _ANY_ROUTE]  # all 401
    decides = {"action.resume": _DECISIONS, "action.reassign": _REASSIGNS}.get(command.name, ())
    return [*_ANY_ROUTE, *refused_tokens, *(_WRITES if command.limited else ()), *decides]


def _error_schema(codes: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string", "enum": codes},
                    "message": {"type": "string"},
                },
                "additionalProperties": True,
            }
        },
    }


def _responses(command: Command[Any, Any]) -> dict[str, Any]:
    assert command.http is not None
    responses: dict[str, Any] = {
        str(command.http.status): {
            "description": command.answer_doc,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    }
    if command.http.etag is not None:
        responses["304"] = {"description": "not modified: `If-None-Match` names the current `ETag`"}
    by_status: dict[int, list[str]] = {}
    for code in error_codes(command):
        by_status.setdefault(STATUS.get(code, 400), []).append(code)
    for status, codes in sorted(by_status.items()):
        responses[str(status)] = {
            "description": ", ".join(codes),
            "content": {"application/json": {"schema": _error_schema(codes)}},
        }
    return responses


def _parameters(command: Command[Any, Any], definitions: dict[str, Any]) -> list[dict[str, Any]]:
    http = command.http
    assert http is not None
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in http.path_fields
    ]
    if http.query is not None:
        schema = command.input.model_json_schema(ref_template="#/components/schemas/{model}")
        # An enum-typed query field refers to its model: it joins the components too.
        definitions.update(schema.pop("$defs", {}))
        for name in command.input.model_fields:
            if name not in http.path_fields:
                parameters.append(
                    {
                        "name": name,
                        "in": "query",
                        "required": False,
                        "schema": schema["properties"].get(name, {}),
                    }
                )
    return parameters


def _operation(command: Command[Any, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    http = command.http
    assert http is not None
    operation: dict[str, Any] = {
        "operationId": http.route,
        "summary": command.name,
        "security": [{"bearer": []}],
        "parameters": _parameters(command, definitions),
        "responses": _responses(command),
    }
    if command.note:
        operation["description"] = command.note
    body = body_model(command)
    if body is not None:
        schema = body.model_json_schema(ref_template="#/components/schemas/{model}")
        # Nested models become the document's components (the refs point there).
        definitions.update(schema.pop("$defs", {}))
        operation["requestBody"] = {
            "required": bool(schema.get("required")),
            "content": {"application/json": {"schema": schema}},
        }
    return operation


def _version() -> str:
    try:
        return version("threadline")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0"


@cache
def openapi() -> dict[str, Any]:
    """The document: every HTTP command of the table, with its body, answer and error codes."""
    paths: dict[str, dict[str, Any]] = {}
    definitions: dict[str, Any] = {}
    for command in COMMANDS:
        if command.http is not None:
            operations = paths.setdefault(command.http.path, {})
            operations[command.http.method.lower()] = _operation(command, definitions)
    for path, (name, summary, answers) in _PROBES.items():
        paths[path] = {
            "get": {
                "operationId": name,
                "summary": summary,
                "security": [],
                "responses": {status: {"description": text} for status, text in answers.items()},
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Threadline", "version": _version()},
        "paths": paths,
        "components": {
            "schemas": definitions,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


async def openapi_endpoint(request: Request) -> Response:
    return JSONResponse(openapi())
