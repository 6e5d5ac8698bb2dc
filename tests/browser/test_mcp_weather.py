"""The weather example extended by an MCP tool (the reference time server over stdio, declared
for the deployment in THREADLINE_MCP_SERVERS), used from Chromium in two tabs."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import Api, OpenPage, assistant_text, send_from
from tests.e2e import harness

TIME_SERVER = {
    "type": "stdio",
    "name": "time",
    "command": sys.executable,
    "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
    "connect_timeout": 60,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    """Overrides the suite's demo server: the weather example plus the time server's tools."""
    directory = tmp_path_factory.mktemp("mcp-weather")
    env = harness.server_env(
        harness.sqlite_url(directory),
        {
            "THREADLINE_AGENT": "examples.weather_agent:agent",
            "THREADLINE_MCP_SERVERS": json.dumps([TIME_SERVER]),
            "PYTHONPATH": str(harness.ROOT),
        },
    )
    handle = harness.start("all", env=env, log_dir=directory)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def tokens(server: harness.ServerHandle) -> dict[str, str]:
    return {
        "alice": server.token("mcp", "user", "alice"),
        "bob": server.token("mcp", "user", "bob"),
    }


def test_an_mcp_tool_answers_in_both_tabs(
    server: harness.ServerHandle, tokens: dict[str, str], open_page: OpenPage
) -> None:
    api = Api(server.url, tokens["alice"])
    try:
        thread = api.create_thread("MCP time")
    finally:
        api.close()
    alice = open_page(tokens["alice"], thread, label="alice")
    bob = open_page(tokens["bob"], thread, label="bob")
    send_from(alice, "What's the time in Asia/Tokyo?")
    for tab in (alice, bob):
        expect(assistant_text(tab).last).to_contain_text("In Asia/Tokyo it is 20")
        expect(tab.get_by_test_id("tool-state").last).to_contain_text("done")
