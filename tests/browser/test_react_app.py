"""The React example (clients/typescript/examples/react-app/) on the hooks, in Chromium.

Built with esbuild here, served by the test on the server's origin (a route of the browser
context, so no CORS is involved), opened by alice and bob in two contexts: both see the reply
stream and each other; bob approves the action alice's message raised; alice's websocket is cut
by the test (closed, and refused while cut: CUT_SCRIPT) and her tab converges without a reload.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, Route, expect

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.browser.helpers import Api, ConsoleLog, committed_assistant_texts, echo, long_text
from tests.e2e import harness

PACKAGE = harness.ROOT / "clients" / "typescript"
APP_PATH = "/react-app/"


@pytest.fixture(scope="module")
def app_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    node = shutil.which("node")
    if node is None or not (PACKAGE / "node_modules" / "esbuild").exists():
        reason = "node and clients/typescript/node_modules are needed (npm ci there)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("react-app")
    result = subprocess.run(
        [node, "examples/react-app/build.mjs", str(out)],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """Chromium as the suite launches it, less its local network access checks: the app's page
    is fulfilled by the test, not loaded from a loopback address, so Chromium would count it as
    public and refuse its websocket to the loopback server."""
    instance = playwright.chromium.launch(
        executable_path=str(CHROMIUM),
        headless=True,
        args=[*CHROMIUM_ARGS, "--disable-features=LocalNetworkAccessChecks"],
    )
    try:
        yield instance
    finally:
        instance.close()


# Installed before the app in alice's page: a WebSocket that the test can cut. While cut, every
# new connection goes to a closed loopback port (refused, as with the network down) and the
# open ones are closed; the client's own reconnection and resync do the rest.
CUT_SCRIPT = """
(() => {
  const Real = window.WebSocket;
  const cut = (window.__cut = { on: false, dead: '', sockets: [], refused: 0 });
  window.WebSocket = class CuttableWebSocket extends Real {
    constructor(url, protocols) {
      if (cut.on) cut.refused += 1;
      super(cut.on ? cut.dead : url, protocols);
      cut.sockets.push(this);
    }
  };
  cut.start = (dead) => {
    cut.on = true;
    cut.dead = dead;
    for (const ws of cut.sockets.splice(0)) ws.close();
  };
})();
"""


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def pages(
    browser: Browser,
    server: harness.ServerHandle,
    app_dir: Path,
) -> Iterator[tuple[list[Page], ConsoleLog]]:
    contexts: list[BrowserContext] = []
    opened: list[Page] = []
    console = ConsoleLog()

    def serve(route: Route) -> None:
        name = route.request.url.split(APP_PATH, 1)[1].split("#")[0].split("?")[0] or "index.html"
        path = app_dir / name
        if not path.is_file():
            route.fulfill(status=404, body="not found")
            return
        kind = "text/html" if name.endswith(".html") else "text/javascript"
        route.fulfill(status=200, body=path.read_bytes(), headers={"Content-Type": kind})

    for label in ("alice", "bob"):
        context = browser.new_context()
        context.set_default_timeout(15_000)
        context.route(f"{server.url}{APP_PATH}**", serve)
        if label == "alice":
            context.add_init_script(CUT_SCRIPT)
        contexts.append(context)
        page = context.new_page()
        console.attach(page, label)
        opened.append(page)
    try:
        yield opened, console
    finally:
        for context in contexts:
            context.close()


def open_app(page: Page, server: harness.ServerHandle, token: str, thread_id: str) -> None:
    page.goto(f"{server.url}{APP_PATH}index.html#token={token}&thread={thread_id}")
    expect(page.get_by_test_id("connection")).to_have_text("open")


def assistant(page: Page) -> list[str]:
    texts = page.locator('[data-testid="message"][data-role="assistant"]').all_text_contents()
    return list(texts)


def test_two_users_stream_approve_and_resync(
    pages: tuple[list[Page], ConsoleLog],
    server: harness.ServerHandle,
    tokens: dict[str, str],
    api: Api,
) -> None:
    (alice, bob), console = pages
    thread_id = api.create_thread("react hooks")
    open_app(alice, server, tokens["alice"], thread_id)
    open_app(bob, server, tokens["bob"], thread_id)

    # Presence shows both, in both tabs.
    for page in (alice, bob):
        expect(page.get_by_test_id("member")).to_have_count(2)
        expect(page.locator('[data-testid="member"][data-subject="alice"]')).to_be_visible()
        expect(page.locator('[data-testid="member"][data-subject="bob"]')).to_be_visible()

    # alice sends; bob sees the reply stream live, then both hold the committed reply.
    text = long_text(60)
    alice.get_by_test_id("composer").fill(text)
    alice.get_by_test_id("send").click()
    expect(bob.get_by_test_id("live-text")).not_to_be_empty()
    partial = bob.get_by_test_id("live-text").text_content() or ""
    assert len(partial) > 0 and echo(text).startswith(partial)
    snapshot = api.wait_run(thread_id)
    for page in (alice, bob):
        expect(page.get_by_test_id("run-status")).to_have_text("completed")
        expect(page.get_by_test_id("live-text")).to_be_empty()
        assert assistant(page) == [echo(text)]

    # alice's message raises an action; bob approves it from his tab. (Other tests may have
    # left actions pending in the scope: the inbox is counted from where it stands.)
    expect(bob.get_by_test_id("inbox-count")).to_have_text(re.compile(r"^\d+$"))
    before = int(bob.get_by_test_id("inbox-count").text_content() or "0")
    alice.get_by_test_id("composer").fill("please email carol@example.com the plan")
    alice.get_by_test_id("send").click()
    action = api.wait_pending(thread_id)
    for page in (alice, bob):
        card = page.locator(f'[data-testid="action"][data-action-id="{action["id"]}"]')
        expect(card).to_be_visible()
        expect(page.get_by_test_id("run-status")).to_have_text("waiting")
    expect(bob.get_by_test_id("inbox-count")).to_have_text(str(before + 1))
    bob.locator(f'[data-action-id="{action["id"]}"] [data-testid="approve"]').click()
    expect(bob.get_by_test_id("action-status")).to_have_count(0)  # the card is gone
    snapshot = api.wait_run(thread_id)
    for page in (alice, bob):
        expect(page.get_by_test_id("action")).to_have_count(0)
        expect(page.get_by_test_id("run-status")).to_have_text("completed")
        expect(page.get_by_test_id("version")).to_have_text(str(snapshot["thread"]["version"]))
    expect(bob.get_by_test_id("inbox-count")).to_have_text(str(before))

    # The network cut: alice's socket is closed and refused; bob talks meanwhile.
    load_id = alice.evaluate("window.__app.loadId")
    dead = f"ws://127.0.0.1:{closed_port()}/v1/ws"
    alice.evaluate("dead => window.__cut.start(dead)", dead)
    expect(alice.get_by_test_id("connection")).to_have_text("reconnecting")
    missed = long_text(8, "while you were away ")
    bob.get_by_test_id("composer").fill(missed)
    bob.get_by_test_id("send").click()
    snapshot = api.wait(
        thread_id,
        "bob's reply committed",
        lambda s: (
            s["run"]["status"] == "completed" and echo(missed) in committed_assistant_texts(s)
        ),
    )
    expect(bob.locator('[data-testid="message"][data-role="assistant"]').last).to_have_text(
        echo(missed)
    )
    expect(alice.get_by_test_id("version")).not_to_have_text(str(snapshot["thread"]["version"]))
    for _ in range(100):  # bounded: the backoff retries within a second or two
        if alice.evaluate("window.__cut.refused"):
            break
        alice.wait_for_timeout(100)
    assert alice.evaluate("window.__cut.refused") >= 1, "no reconnection was tried during the cut"
    alice.evaluate("window.__cut.on = false")
    # Her backoff brings her back; the resubscription refetches what she missed.
    expect(alice.get_by_test_id("connection")).to_have_text("open", timeout=30_000)
    expect(alice.get_by_test_id("version")).to_have_text(str(snapshot["thread"]["version"]))
    expect(alice.locator('[data-testid="message"][data-role="assistant"]').last).to_have_text(
        echo(missed)
    )
    assert alice.evaluate("window.__app.loadId") == load_id, "the page was reloaded"
    for page in (alice, bob):
        expect(page.get_by_test_id("member")).to_have_count(2)
    console.flush()
    problems = [entry for entry in console.problems() if dead not in entry]
    assert problems == [], "\n".join(problems)
