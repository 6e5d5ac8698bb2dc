"""Cross-origin browser clients: the CORS allow-list (THREADLINE_CORS_ALLOWED_ORIGINS)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect
from websockets.typing import Origin

from tests.e2e import harness

ALLOWED = "https://app.example.com"
FOREIGN = "https://evil.example.net"
TIMEOUT = 10.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    directory = tmp_path_factory.mktemp("cors")
    env = harness.server_env(
        harness.sqlite_url(directory),
        {
            "THREADLINE_CORS_ALLOWED_ORIGINS": f'["{ALLOWED}"]',
            "THREADLINE_WS_ALLOWED_ORIGINS": '["https://other-ws.example.com"]',
        },
    )
    with harness.start("all", env, log_dir=directory) as handle:
        yield handle


def preflight(server: harness.ServerHandle, path: str, origin: str) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    return httpx.options(f"{server.url}{path}", headers=headers, timeout=TIMEOUT)


@pytest.mark.parametrize("path", ["/v1/ag-ui", "/v1/ai-sdk/chat", "/v1/threads"])
def test_a_listed_origin_gets_its_preflight_and_its_answers(
    server: harness.ServerHandle, path: str
) -> None:
    answer = preflight(server, path, ALLOWED)
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == ALLOWED
    allowed_headers = answer.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed_headers and "content-type" in allowed_headers
    assert "POST" in answer.headers["access-control-allow-methods"]
    token = server.token("alpha")
    headers = {"Origin": ALLOWED, "Authorization": f"Bearer {token}"}
    listed = httpx.get(f"{server.url}/v1/threads", headers=headers, timeout=TIMEOUT)
    assert listed.status_code == 200
    assert listed.headers["access-control-allow-origin"] == ALLOWED
    # Errors too: a browser app must be able to read why it was refused.
    refused = httpx.get(f"{server.url}/v1/me", headers={"Origin": ALLOWED}, timeout=TIMEOUT)
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == ALLOWED


def test_a_foreign_origin_gets_no_cors_headers(server: harness.ServerHandle) -> None:
    answer = preflight(server, "/v1/ag-ui", FOREIGN)
    assert answer.status_code == 400
    assert "access-control-allow-origin" not in answer.headers
    token = server.token("alpha")
    headers = {"Origin": FOREIGN, "Authorization": f"Bearer {token}"}
    listed = httpx.get(f"{server.url}/v1/threads", headers=headers, timeout=TIMEOUT)
    assert "access-control-allow-origin" not in listed.headers


def test_an_origin_allowed_for_http_may_open_a_websocket(server: harness.ServerHandle) -> None:
    token = server.token("alpha")
    url = f"{server.ws_url}?token={token}"
    for origin in (ALLOWED, "https://other-ws.example.com"):
        with connect(url, origin=Origin(origin), open_timeout=TIMEOUT) as ws:
            ws.send('{"type": "ping", "id": 1}')
            assert ws.recv(timeout=TIMEOUT) == '{"type":"pong","id":1}'


def test_cors_is_off_by_default(tmp_path: Path) -> None:
    env = harness.server_env(harness.sqlite_url(tmp_path))
    with harness.start("all", env, log_dir=tmp_path) as plain:
        answer = preflight(plain, "/v1/ag-ui", ALLOWED)
        assert answer.status_code == 405
        assert "access-control-allow-origin" not in answer.headers
