"""Fixtures for end-to-end tests: one real server process per module, tokens per scope."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.e2e import harness


class Api:
    """A small HTTP client bound to one bearer token, with bounded waits on thread state."""

    def __init__(self, base_url: str, token: str | None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=10.0)
        self.token = token

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.request(method, path, **kwargs)

    def create_thread(self, **body: Any) -> dict[str, Any]:
        response = self.http.post("/v1/threads", json=body)
        assert response.status_code == 201, response.text
        return dict(response.json())

    def snapshot(self, thread_id: str, **params: Any) -> dict[str, Any]:
        response = self.http.get(f"/v1/threads/{thread_id}", params=params)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def send(self, thread_id: str, text: str, **body: Any) -> dict[str, Any]:
        response = self.http.post(f"/v1/threads/{thread_id}/messages", json={"text": text, **body})
        assert response.status_code == 202, response.text
        return dict(response.json())

    def wait_run(
        self, thread_id: str, statuses: tuple[str, ...] = ("completed",), timeout: float = 15.0
    ) -> dict[str, Any]:
        """Poll the snapshot until its run reaches one of `statuses` (and the queue is empty)."""
        deadline = time.monotonic() + timeout
        snapshot: dict[str, Any] = {}
        while time.monotonic() < deadline:
            snapshot = self.snapshot(thread_id)
            run = snapshot["run"]
            if run is not None and run["status"] in statuses and not snapshot["queue"]:
                return snapshot
            time.sleep(0.05)
        raise AssertionError(f"run of {thread_id} never reached {statuses}: {snapshot}")


# A valid body per route name, so that only authentication, scope or role can refuse it.
VALID_BODIES: dict[str, Any] = {
    "snapshot": None,
    "rename_thread": {"title": "renamed"},
    "update_thread_metadata": {"metadata": {"owner": "x"}},
    "send_message": {"text": "hello"},
    "set_visibility": {"visibility": "hidden"},
    "cancel_queued": None,
    "queued_item": None,
    "resume": {"payload": {"approved": True}},
    "client_result": {"output": {"ok": True}},
    "manual_result": {"output": {"ok": True}},
    "stop_run": None,
    "regenerate": {},
    "retry_run": {},
    "reassign": {"to_subject": "someone-else"},
}


def fill(path: str, thread_id: str) -> str:
    return (
        path.replace("{thread_id}", thread_id)
        .replace("{message_id}", "msg-x")
        .replace("{item_id}", "item-x")
        .replace("{action_id}", "act-x")
        .replace("{run_id}", "run-x")
    )


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    directory = tmp_path_factory.mktemp("server")
    handle = harness.start("all", log_dir=directory, database_url=harness.sqlite_url(directory))
    try:
        yield handle
    finally:
        code = handle.stop()
        assert code in (0, -15), f"server exited with {code}\n{handle.log()[-4000:]}"


@pytest.fixture(scope="module")
def tokens(server: harness.ServerHandle) -> dict[str, str]:
    """alice/bob: users of scope alpha; carol: user of beta; svc: backend of alpha, ..."""
    specs: dict[str, tuple[str | list[str], str, str]] = {
        "alice": ("alpha", "user", "alice"),
        "bob": ("alpha", "user", "bob"),
        "carol": ("beta", "user", "carol"),
        "svc": ("alpha", "backend", "svc"),
        "beta_svc": ("beta", "backend", "beta-svc"),
        "multi": (["alpha", "gamma"], "admin", "root"),
    }
    # One `threadline token create` process each, run side by side to keep set-up short.
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = {name: pool.submit(server.token, *spec) for name, spec in specs.items()}
        return {name: future.result(timeout=60) for name, future in futures.items()}


@pytest.fixture
def api_for(server: harness.ServerHandle, tokens: dict[str, str]) -> Iterator[Any]:
    clients: list[Api] = []

    def make(name: str | None) -> Api:
        client = Api(server.url, tokens[name] if name else None)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def alice(api_for: Any) -> Api:
    return api_for("alice")  # type: ignore[no-any-return]
