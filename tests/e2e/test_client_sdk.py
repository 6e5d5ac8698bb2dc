"""The Python SDK against a real server process: the README's examples run verbatim, watches
fail fast with typed errors, refused connections raise the SDK's error, threads are found."""

from __future__ import annotations

import asyncio
import re
import socket
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import harness
from tests.e2e.conftest import Api
from threadline_client import (
    ConnectionFailed,
    Forbidden,
    SyncThreadlineClient,
    ThreadlineClient,
    Unauthorized,
)

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_client_examples() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    return [block for block in blocks if "threadline_client" in block]


def completed(watch: Any) -> bool:
    snapshot = watch.snapshot
    return bool(watch.settled and snapshot.run is not None and snapshot.run.status == "completed")


def pending_email(api: Api) -> str:
    thread_id = str(api.create_thread()["thread"]["id"])
    api.send(thread_id, "please email bob@example.com the notes")
    api.wait_run(thread_id, ("waiting",))
    return thread_id


async def test_the_readme_python_examples_run_verbatim(
    server: harness.ServerHandle, tokens: dict[str, str], alice: Api
) -> None:
    examples = readme_client_examples()
    assert examples, "the README has Python client examples"
    for example in examples:
        thread_id = pending_email(alice)
        # Top-level `async with`, as in a notebook: run as the body of a coroutine.
        # The one change: the README's address is this test server's.
        example = example.replace("http://127.0.0.1:8000", server.url)
        source = "async def _example():\n" + textwrap.indent(example, "    ")
        namespace: dict[str, Any] = {"token": tokens["alice"], "thread_id": thread_id}
        exec(compile(source, str(README), "exec"), namespace)
        await asyncio.wait_for(namespace["_example"](), 60)
        assert alice.snapshot(thread_id)["run"]["status"] == "completed"


async def test_an_action_from_a_snapshot_can_be_resumed(
    server: harness.ServerHandle, tokens: dict[str, str], alice: Api
) -> None:
    thread_id = pending_email(alice)
    async with ThreadlineClient(server.url, tokens["alice"]) as tl:
        action = (await tl.snapshot(thread_id)).pending_actions[0]
        assert action.thread_id == thread_id
        await tl.resume(action, {"approved": True})
        async with tl.watch(thread_id) as watch:
            await watch.until(completed)


@pytest.mark.parametrize(("token", "error"), [("tl_not-a-token", Unauthorized)])
async def test_a_watch_with_a_bad_token_raises_within_a_second(
    server: harness.ServerHandle, token: str, error: type[Exception], alice: Api
) -> None:
    thread_id = str(alice.create_thread()["thread"]["id"])
    async with ThreadlineClient(server.url, token) as tl:
        started = time.monotonic()
        with pytest.raises(error):
            async with tl.watch(thread_id) as watch:
                await watch.until(lambda w: w.settled, timeout=5)
        assert time.monotonic() - started < 1.0


async def test_a_watch_whose_token_is_revoked_raises_forbidden(
    server: harness.ServerHandle, alice: Api
) -> None:
    thread_id = str(alice.create_thread()["thread"]["id"])
    token = server.token("alpha", "user", "dave")
    async with ThreadlineClient(server.url, token) as tl, tl.watch(thread_id) as watch:
        await watch.until(lambda w: w.settled, timeout=10)
        _revoke(server, token)
        started = time.monotonic()
        with pytest.raises(Forbidden):
            await watch.until(lambda w: False, timeout=10)
        assert time.monotonic() - started < 6.0  # the bus at once, the 5 s recheck at worst


def _revoke(server: harness.ServerHandle, token: str) -> None:
    admin = server.token("alpha", "admin", "root")
    api = Api(server.url, admin)
    try:
        answer = api.request("POST", "/v1/tokens/revoke", json={"token": token})
        assert answer.status_code == 200, answer.text
    finally:
        api.close()


async def test_a_refused_connection_raises_the_sdk_error() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with ThreadlineClient(f"http://127.0.0.1:{port}", "tl_x", attempts=2) as tl:
        with pytest.raises(ConnectionFailed):
            await tl.list_threads()


def test_the_sync_client_watches_and_finds_threads(
    server: harness.ServerHandle, tokens: dict[str, str]
) -> None:
    with SyncThreadlineClient(server.url, tokens["alice"]) as tl:
        owner = f"sync-{time.monotonic_ns()}"
        made = [tl.create_thread(metadata={"owner": owner}).thread.id for _ in range(3)]
        patched = tl.update_metadata(made[0], {"team": "red"})
        assert patched.metadata == {"owner": owner, "team": "red"}
        page = tl.list_threads(2, metadata={"owner": owner})
        assert len(page.threads) == 2 and page.next_cursor is not None
        found = [t.id for t in tl.threads(page_size=2, metadata={"owner": owner})]
        assert sorted(found) == sorted(made)
        tl.send(made[1], "hello")
        with tl.watch(made[1]) as watch:
            watch.until(completed)
            assert watch.snapshot is not None
            assert watch.snapshot.assistant_text() == "You said: hello"
        with tl.watch_actions() as inbox:
            inbox.until(lambda w: w.connections > 0, timeout=10)
