"""Chromium signs in through a real OIDC provider's login page (authorization code + PKCE),
opens a thread, approves an action, and its socket outlives the first access token."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from playwright.sync_api import Browser, Page, WebSocket, expect

from tests.browser.conftest import DEFAULT_VIEWPORT, TIMEOUT_MS
from tests.browser.helpers import ConsoleLog, assistant_text, echo, expect_settled, send_from
from tests.e2e import harness, jsclients
from tests.e2e.oidc import AUDIENCE, Provider, issuer_config

pytestmark = pytest.mark.browser

OFF_MACHINE = re.compile(r"^https?://(?!127\.0\.0\.1[:/])")
TTL = 10  # seconds an access token of the page lives: refreshed a little before


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("oidc-browser")


@pytest.fixture(scope="module")
def port() -> int:
    return harness.free_port()


@pytest.fixture(scope="module")
def provider(directory: Path, port: int) -> Iterator[Provider]:
    page = {
        "client_id": "threadline-web",
        "redirect_uris": [f"http://127.0.0.1:{port}/"],
        "ttl": TTL,
        "claims": {"tl_scopes": ["demo"]},
    }
    issuer = Provider(jsclients.require_node_clients(), directory, [page])
    try:
        yield issuer
    finally:
        issuer.close()


@pytest.fixture(scope="module")
def oidc_server(directory: Path, port: int, provider: Provider) -> Iterator[harness.ServerHandle]:
    sign_in = {
        "issuer": provider.issuer,
        "client_id": "threadline-web",
        "scopes": "openid offline_access threadline",
        "params": {"resource": AUDIENCE, "prompt": "consent"},
    }
    env = harness.server_env(
        harness.sqlite_url(directory),
        {
            "THREADLINE_OIDC_ISSUERS": json.dumps([issuer_config(provider)]),
            "THREADLINE_OIDC_BROWSER": json.dumps(sign_in),
            "THREADLINE_OIDC_LEEWAY": "0",
            "THREADLINE_DEMO_DELAY_MS": "5",
        },
    )
    with harness.start("all", env, port=port, log_dir=directory) as handle:
        yield handle


def stored_access_token(page: Page) -> str:
    raw = page.evaluate("() => sessionStorage.getItem('threadline.oidc.tokens')")
    assert isinstance(raw, str), "no tokens in sessionStorage"
    return str(json.loads(raw)["access_token"])


def test_chromium_signs_in_at_the_provider_approves_and_refreshes(
    browser: Browser, oidc_server: harness.ServerHandle, provider: Provider, console: ConsoleLog
) -> None:
    context = browser.new_context(viewport=DEFAULT_VIEWPORT)
    context.set_default_timeout(TIMEOUT_MS)
    # The provider's pages ask for a web font off this machine and for a favicon it lacks: both
    # answered empty here, so the console check stays strict for every page of the journey.
    context.route(OFF_MACHINE, lambda route: route.fulfill(status=200, body=""))
    context.route(f"{provider.issuer}/favicon.ico", lambda route: route.fulfill(status=200))
    page = context.new_page()
    console.attach(page, "oidc")
    sockets: list[WebSocket] = []
    page.on("websocket", lambda ws: sockets.append(ws))
    try:
        page.goto(f"{oidc_server.url}/")
        # The provider's own login page (devInteractions: any login), then its consent page.
        expect(page).to_have_url(re.compile(re.escape(provider.issuer) + "/interaction/"))
        page.locator('input[name="login"]').fill("ann")
        page.locator('input[name="password"]').fill("any password")
        page.locator("button[type=submit]").click()
        page.locator("button[type=submit]", has_text="Continue").click()

        # Back on Threadline: signed in, and neither the code nor a token is in the URL.
        expect(page.get_by_test_id("connection-state")).to_have_text("connected")
        expect(page).to_have_url(f"{oidc_server.url}/")
        expect(page.locator("#whoami")).to_have_text("ann · user · demo")
        first = stored_access_token(page)
        claims = jwt.decode(first, options={"verify_signature": False})
        assert claims["sub"] == "ann" and claims["iss"] == provider.issuer
        for ws in sockets:
            assert first not in ws.url and "token" not in ws.url

        page.get_by_test_id("new-thread-title").fill("Signed in with OIDC")
        page.get_by_test_id("new-thread-submit").click()
        expect(page).to_have_url(re.compile(r"/\?thread=th_\w+$"))
        send_from(page, "email someone@example.com the minutes")
        page.get_by_test_id("approve-button").click()
        expect(page.get_by_test_id("pending-action")).to_have_count(0)
        expect(page.get_by_test_id("tool-resolution")).to_contain_text("Action resolved by ann")
        expect_settled(page)

        # Past the first access token's expiry: renewed, and the same socket still delivers.
        page.wait_for_timeout(max(0.0, float(claims["exp"]) + 1.0 - time.time()) * 1000)
        assert stored_access_token(page) != first
        expect(page.get_by_test_id("connection-state")).to_have_text("connected")
        send_from(page, "still signed in")
        expect(assistant_text(page).last).to_have_text(echo("still signed in"))
        opened = [ws for ws in sockets if ws.url.endswith("/v1/ws")]
        assert len(opened) == 1 and not opened[0].is_closed(), [ws.url for ws in opened]
    finally:
        context.close()


def test_a_tl_token_still_works_where_sign_in_is_configured(
    browser: Browser, oidc_server: harness.ServerHandle, console: ConsoleLog
) -> None:
    token = oidc_server.token("demo", "user", "tl-user")
    context = browser.new_context(viewport=DEFAULT_VIEWPORT)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    console.attach(page, "tl")
    try:
        page.goto(f"{oidc_server.url}/#token={token}")
        expect(page.get_by_test_id("connection-state")).to_have_text("connected")
        expect(page).to_have_url(f"{oidc_server.url}/#token={token}")  # no detour to a login
        expect(page.locator("#whoami")).to_have_text("tl-user · user · demo")
    finally:
        context.close()
