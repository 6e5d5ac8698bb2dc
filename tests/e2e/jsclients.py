"""Run the node drivers of tests/js (official AG-UI and AI SDK clients) from e2e tests.

Also the fixtures their test modules share (`node`, `server`, `tokens`): a module imports them
by name (`from tests.e2e.jsclients import node, server, tokens`) and gets its own server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.service.client_threads import client_thread_id
from tests.e2e import harness

JS_DIR = harness.ROOT / "tests" / "js"
# The one way to install the client libraries (pinned in tests/js/package-lock.json).
INSTALL = "npm ci --prefix tests/js"
NODE_TIMEOUT = 60.0


def require_node_clients() -> str:
    """The node binary; skips (fails under CI=true) without node or tests/js/node_modules."""
    node = shutil.which("node")
    missing = (
        "node is not installed"
        if node is None
        else f"tests/js/node_modules is missing: run `{INSTALL}`"
        if not (JS_DIR / "node_modules" / "@ag-ui" / "client").is_dir()
        or not (JS_DIR / "node_modules" / "ai").is_dir()
        else ""
    )
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing} (required under CI=true)")
        pytest.skip(missing)
    assert node is not None
    return node


# Who the shared `tokens` fixture can mint: name -> (scope, role). Minted on first use.
PRINCIPALS = {
    "alice": ("alpha", "user"),
    "bob": ("alpha", "user"),
    "carol": ("beta", "user"),
    "svc": ("alpha", "backend"),
}


class Tokens(dict[str, str]):
    """Tokens by subject, minted on first use (each `token create` is a process start)."""

    def __init__(self, server: harness.ServerHandle) -> None:
        super().__init__()
        self.server = server

    def __missing__(self, name: str) -> str:
        scope, role = PRINCIPALS[name]
        token = self[name] = self.server.token(scope, role, name)
        return token


@pytest.fixture(scope="module")
def node() -> str:
    return require_node_clients()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    """`threadline serve` (embedded, demo agent at 50 ms a chunk) for one test module."""
    directory = tmp_path_factory.mktemp("jsclients")
    env = harness.server_env(harness.sqlite_url(directory), {"THREADLINE_DEMO_DELAY_MS": "50"})
    with harness.start("all", env, log_dir=directory) as handle:
        yield handle


@pytest.fixture(scope="module")
def tokens(server: harness.ServerHandle) -> Tokens:
    return Tokens(server)


def start_driver(node: str, script: str, options: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [node, str(JS_DIR / script), json.dumps(options)],
        cwd=JS_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_driver(process: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, err = process.communicate(timeout=NODE_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"node driver timed out\n{err[-3000:]}") from None
    assert process.returncode == 0, f"node driver failed ({process.returncode})\n{err[-3000:]}"
    try:
        report: dict[str, Any] = json.loads(out)
    except json.JSONDecodeError as exc:
        what = f"node driver printed no report: {out[-500:]!r}\n{err[-3000:]}"
        raise AssertionError(what) from exc
    return report


def drive(node: str, script: str, options: dict[str, Any]) -> dict[str, Any]:
    return finish_driver(start_driver(node, script, options))


def wait_for(path: Path, timeout: float = 30.0) -> str:
    """Wait until a driver wrote `path` (its first streamed delta arrived)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def thread_id_of(url: str, token: str, client_id: str) -> str:
    """The Threadline id of the thread a client id names, in the token's (one) scope."""
    me = httpx.get(f"{url}/v1/me", headers={"Authorization": f"Bearer {token}"}, timeout=10.0)
    assert me.status_code == 200, me.text
    [scope] = me.json()["scopes"]
    return client_thread_id(scope, client_id)


def snapshot(url: str, token: str, client_id: str) -> dict[str, Any]:
    """The snapshot of the thread an AG-UI or AI SDK client named `client_id`."""
    response = httpx.get(
        f"{url}/v1/threads/{thread_id_of(url, token, client_id)}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10.0,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def long_text(words: int = 200) -> str:
    """A message the demo echoes in 200 chunks: seconds, at the tests' chunk delay."""
    return " ".join(f"word{i}" for i in range(words))
