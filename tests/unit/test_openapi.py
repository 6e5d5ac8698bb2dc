"""/openapi.json, generated from the command table, agrees with docs/protocol.md and the app."""

from __future__ import annotations

import re
from typing import Any

import pytest
from openapi_spec_validator import validate

from server.app import create_app
from server.protocol.wire_errors import STATUS
from server.protocol_catalog import DOC
from server.settings import Settings
from server.transports.openapi import openapi

HTTP_ROW = re.compile(
    r"^\| `(?P<method>[A-Z]+) (?P<path>/[^`\[]*)(?:\[[^`]*\])?` \|.*\| (?P<status>\d{3}) "
)
ERROR_ROW = re.compile(r"^\| `(?P<code>[a-z_]+)` \| (?P<status>\d{3}) \|")


def doc_section(name: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    begin = f"<!-- generated: {name} (python -m server.protocol_catalog --write) -->"
    return text.split(begin, 1)[1].split(f"<!-- end generated: {name} -->", 1)[0]


def operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): operation
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    }


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(openapi())


def test_every_route_of_the_protocol_doc_is_an_operation_with_its_status() -> None:
    documented = {}
    for line in doc_section("http").splitlines():
        if match := HTTP_ROW.match(line):
            documented[(match["method"], match["path"])] = match["status"]
    assert documented, "the http table of docs/protocol.md was not found"
    ops = operations(openapi())
    commands = {key: op for key, op in ops.items() if op["security"]}
    assert set(commands) == set(documented)
    for key, status in documented.items():
        assert status in commands[key]["responses"], key


def test_every_operation_is_a_route_of_the_app() -> None:
    app = create_app(Settings(database_url="sqlite:///:memory:"))
    served = {
        (method, getattr(route, "path", ""))
        for route in app.routes
        for method in getattr(route, "methods", None) or ()
        if method != "HEAD"
    }
    assert set(operations(openapi())) <= served
    assert ("GET", "/openapi.json") in served


def test_error_codes_have_the_documented_statuses() -> None:
    text = DOC.read_text(encoding="utf-8")
    errors = text.split("## Errors", 1)[1].split("### Limits", 1)[0]
    documented = {
        m["code"]: m["status"] for line in errors.splitlines() if (m := ERROR_ROW.match(line))
    }
    seen: dict[str, str] = {}
    for operation in operations(openapi()).values():
        for status, response in operation["responses"].items():
            schema = response.get("content", {}).get("application/json", {}).get("schema", {})
            codes = schema.get("properties", {}).get("error", {}).get("properties", {})
            for code in codes.get("code", {}).get("enum", []):
                seen[code] = status
    assert seen, "no operation declares an error code"
    for code, status in seen.items():
        assert documented.get(code) == status, (
            f"{code}: {status} here, {documented.get(code)} in docs"
        )
        assert STATUS[code] == int(status)
    # Every code an HTTP route can answer, except the websocket-only and internal ones.
    assert set(documented) - set(seen) == {"too_many_connections", "lease_lost", "internal_error"}


@pytest.mark.parametrize(
    "key", sorted(k for k, op in operations(openapi()).items() if "requestBody" in op)
)
def test_body_schemas_resolve(key: tuple[str, str]) -> None:
    document = openapi()
    body = operations(document)[key]["requestBody"]["content"]["application/json"]["schema"]
    refs = re.findall(r"#/components/schemas/(\w+)", str(body))
    assert set(refs) <= set(document["components"]["schemas"])
