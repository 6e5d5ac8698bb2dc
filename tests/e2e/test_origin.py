"""The optional Origin allow-list for websocket upgrades (THREADLINE_WS_ALLOWED_ORIGINS)."""

from __future__ import annotations

from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin

from tests.e2e import harness

ALLOWED = "https://chat.example.com"


def test_only_listed_origins_may_open_a_websocket(tmp_path: Path) -> None:
    env = harness.server_env(
        harness.sqlite_url(tmp_path), {"THREADLINE_WS_ALLOWED_ORIGINS": f'["{ALLOWED}"]'}
    )
    with harness.start("all", env, log_dir=tmp_path) as server:
        token = server.token("demo")
        url = f"{server.ws_url}?token={token}"
        with connect(url, origin=Origin(ALLOWED)) as ws:
            ws.send('{"type": "ping", "id": 1}')
            assert ws.recv(timeout=10) == '{"type":"pong","id":1}'
        for origin in (Origin("https://evil.example.net"), None):
            with pytest.raises(InvalidStatus) as refused:
                connect(url, origin=origin)
            assert refused.value.response.status_code == 403
