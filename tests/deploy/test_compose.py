"""docker-compose.yml started for real: the protocol through nginx, a killed worker, a stopped
gateway, the browser page, and no token in any log. One stack for the module, torn down after."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from runtime.demo import REDACTED
from tests.deploy.stack import Stack, docker, started
from tests.e2e.follower import Follower

pytestmark = pytest.mark.deploy

RUN_TIMEOUT = 60.0
# Worker leases last 15 s (THREADLINE_LEASE_TTL's default): a takeover comes after that.
TAKEOVER_TIMEOUT = 60.0
ACCEPTED = '" [accepted]'


@pytest.fixture(scope="module")
def stack(docker_ready: None) -> Iterator[Stack]:
    with started() as running:
        yield running


@pytest.fixture(scope="module")
def tokens(stack: Stack) -> dict[str, str]:
    """alice and bob share scope `team`; eve has scope `other` only."""
    specs = {"alice": "team", "bob": "team", "eve": "other"}
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = {
            name: pool.submit(stack.token, scope, "user", name) for name, scope in specs.items()
        }
        return {name: future.result(timeout=300) for name, future in futures.items()}


def client(stack: Stack, token: str, name: str) -> Follower:
    return Follower(stack.url, stack.ws_url, token, name)


async def new_thread(follower: Follower, title: str) -> str:
    response = await follower.http("POST", "/v1/threads", json={"title": title})
    assert response.status_code == 201, response.text
    return str(response.json()["thread"]["id"])


async def wait_run(
    follower: Follower, run_id: str, statuses: tuple[str, ...], timeout: float = RUN_TIMEOUT
) -> dict[str, Any]:
    """The server's snapshot once run `run_id` has one of `statuses`."""
    deadline = time.monotonic() + timeout
    snapshot: dict[str, Any] = {}
    while time.monotonic() < deadline:
        snapshot = await follower.server_snapshot()
        run = snapshot["run"]
        if run is not None and run["id"] == run_id and run["status"] in statuses:
            return snapshot
        await asyncio.sleep(0.1)
    raise AssertionError(f"run {run_id} never reached {statuses}: {snapshot.get('run')}")


async def send(follower: Follower, thread_id: str, text: str) -> str:
    ack = await follower.request({"type": "message.send", "thread_id": thread_id, "text": text})
    assert ack["type"] == "ack", ack
    return str(ack["run_id"])


async def pending_action(follower: Follower) -> dict[str, Any]:
    await follower.wait_for(lambda f: bool(f.snapshot and f.snapshot["pending_actions"]), 30)
    assert follower.snapshot is not None
    (action,) = follower.snapshot["pending_actions"]
    assert (action["tool_name"], action["kind"]) == ("send_email", "approval"), action
    return dict(action)


def assistant_text(snapshot: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for message in snapshot["messages"]
        if message["role"] == "assistant"
        for part in message["parts"]
    )


def streamed_text(follower: Follower, run_id: str) -> str:
    return "".join(
        c["chunk"]["delta"] for c in follower.chunks(run_id) if c["chunk"]["type"] == "text-delta"
    )


def last_resolver(snapshot: dict[str, Any]) -> str:
    """Who resolved the newest tool call's approval."""
    parts = [p for m in snapshot["messages"] for p in m["parts"] if p["type"] == "tool-call"]
    return str(parts[-1]["waiting"]["resolution"]["subject"])


def long_text(words: int, tag: str) -> str:
    return " ".join(f"{tag}{i:03d}" for i in range(words))


def test_stack_is_up_without_a_development_token(stack: Stack) -> None:
    assert len(stack.containers("gateway")) == len(stack.containers("worker")) == 2
    count = stack.compose(
        "exec",
        "-T",
        "postgres",
        "psql",
        "-U",
        "threadline",
        "-d",
        "threadline",
        "-tAc",
        "SELECT count(*) FROM api_tokens WHERE subject = 'dev'",
    ).stdout.strip()
    assert count == "0"
    for container in stack.containers("gateway") + stack.containers("worker"):
        assert "Threadline is starting. Open" not in stack.logs(container)
    assert httpx.get(f"{stack.url}/healthz", timeout=5).status_code == 200


async def test_protocol_through_nginx(stack: Stack, tokens: dict[str, str]) -> None:
    async with (
        client(stack, tokens["alice"], "alice") as alice,
        client(stack, tokens["bob"], "bob") as bob,
    ):
        thread_id = await new_thread(alice, "deployed")
        for follower in (alice, bob):
            await follower.subscribe(thread_id)

        # Alice asks for an e-mail; Bob, on his own connection, approves it.
        run_id = await send(alice, thread_id, "please email carol@example.com the minutes")
        action = await pending_action(bob)
        resume = {"type": "action.resume", "thread_id": thread_id, "action_id": action["id"]}
        answer = await bob.request({**resume, "payload": {"approved": True, "note": "bob"}})
        assert answer["type"] == "ack", answer
        final = await wait_run(alice, run_id, ("completed",))
        for follower in (alice, bob):
            await follower.converge(final)
        assert last_resolver(final) == "bob"
        # The address is redacted in the reply, committed and streamed alike.
        reply = assistant_text(final)
        assert "Done: I sent the email" in reply and REDACTED in reply, reply
        for follower in (alice, bob):
            assert "carol@example.com" not in streamed_text(follower, run_id)

        # Both resume the next action at once: exactly one wins, the other learns who.
        run_id = await send(alice, thread_id, "email dave@example.com the agenda")
        action = await pending_action(alice)
        await pending_action(bob)
        resume = {"type": "action.resume", "thread_id": thread_id, "action_id": action["id"]}
        answers = await asyncio.gather(
            alice.request({**resume, "payload": {"approved": True}}),
            bob.request({**resume, "payload": {"approved": False}}),
        )
        kinds = sorted(answer["type"] for answer in answers)
        assert kinds == ["ack", "error"], answers
        winner = "alice" if answers[0]["type"] == "ack" else "bob"
        (loser,) = [answer for answer in answers if answer["type"] == "error"]
        assert loser["code"] == "conflict" and loser["resolved_by"] == winner, loser
        final = await wait_run(alice, run_id, ("completed",))
        assert last_resolver(final) == winner
        for follower in (alice, bob):
            await follower.converge(final)

        # Another scope sees nothing of the thread, over websocket and HTTP alike.
        async with client(stack, tokens["eve"], "eve") as eve:
            answer = await eve.request({"type": "subscribe", "thread_id": thread_id})
            assert (answer["type"], answer["code"]) == ("error", "not_found"), answer
            answer = await eve.request(
                {"type": "message.send", "thread_id": thread_id, "text": "let me in"}
            )
            assert (answer["type"], answer["code"]) == ("error", "not_found"), answer
            response = await eve.http("GET", f"/v1/threads/{thread_id}")
            assert response.status_code == 404, response.text
            assert response.json()["error"]["code"] == "not_found"
            assert not [r for r in eve.frames if r.frame.get("thread_id") == thread_id]
        assert (await alice.server_snapshot()) == final

        # Bob stops Alice's long reply while it streams.
        run_id = await send(alice, thread_id, long_text(150, "stop"))
        await bob.wait_for(lambda f: len(f.chunks(run_id)) >= 5, 30)
        stop = await bob.request({"type": "run.stop", "thread_id": thread_id, "run_id": run_id})
        assert stop["type"] == "ack", stop
        final = await wait_run(alice, run_id, ("cancelled",))
        for follower in (alice, bob):
            await follower.converge(final)
        kept = final["messages"][-1]
        assert kept["role"] == "assistant"
        full = f"You said: {long_text(150, 'stop')}"
        assert full.startswith(assistant_text({"messages": [kept]})) and len(
            assistant_text({"messages": [kept]})
        ) < len(full)


async def test_killed_worker_run_completed_by_the_other(
    stack: Stack, tokens: dict[str, str]
) -> None:
    doomed, survivor = stack.containers("worker")
    # Only `doomed` can take the run: `survivor` is frozen until the run streams.
    docker("pause", survivor)
    try:
        async with client(stack, tokens["alice"], "watcher") as watcher:
            thread_id = await new_thread(watcher, "worker kill")
            await watcher.subscribe(thread_id)
            text = long_text(150, "kill")  # ~190 pieces, ~6 s of streaming
            run_id = await send(watcher, thread_id, text)
            await watcher.wait_for(lambda f: len(f.chunks(run_id)) >= 10, 30)
            docker("unpause", survivor)
            # No restart by the engine: the run must be finished by the other worker.
            docker("update", "--restart=no", doomed)
            docker("kill", doomed)

            def taken_over(f: Follower) -> bool:
                return any(c["chunk"]["type"] == "run-takeover" for c in f.chunks(run_id))

            await watcher.wait_for(taken_over, TAKEOVER_TIMEOUT)
            final = await wait_run(watcher, run_id, ("completed",), TAKEOVER_TIMEOUT)
            await watcher.converge(final)
        assert stack.state(doomed, ".State.Running") == "false"
        assert [m["role"] for m in final["messages"]] == ["user", "assistant"]
        assert assistant_text(final) == f"You said: {text}"
    finally:
        with contextlib.suppress(RuntimeError):
            docker("unpause", survivor)
        docker("update", "--restart=unless-stopped", doomed, check=False)
        docker("start", doomed, check=False)


def test_browser_page_through_nginx(stack: Stack, tokens: dict[str, str]) -> None:
    from tests.deploy.browser import check_page

    check_page(stack, tokens["alice"])


def accepted_counts(stack: Stack, gateways: list[str]) -> list[int]:
    return [stack.logs(gateway).count(ACCEPTED) for gateway in gateways]


async def gateway_of_new_client(stack: Stack, gateways: list[str], follower: Follower) -> int:
    """Connect `follower` through nginx and tell which gateway accepted it (its log says so)."""
    before = await asyncio.to_thread(accepted_counts, stack, gateways)
    await follower.__aenter__()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = await asyncio.to_thread(accepted_counts, stack, gateways)
        grown = [i for i, (a, b) in enumerate(zip(after, before, strict=True)) if a > b]
        if len(grown) == 1:
            return grown[0]
        await asyncio.sleep(0.2)
    raise AssertionError(f"no single gateway logged the connection: {before} -> {after}")


async def test_stopped_gateway_clients_reconnect_and_converge(
    stack: Stack, tokens: dict[str, str]
) -> None:
    gateways = stack.containers("gateway")
    placed: list[tuple[Follower, int]] = []
    try:
        # Clients one by one until each gateway serves at least one (nginx picks at random).
        for index in range(24):
            follower = client(stack, tokens["alice"], f"client{index}")
            placed.append((follower, await gateway_of_new_client(stack, gateways, follower)))
            if {g for _, g in placed} == {0, 1}:
                break
        assert {g for _, g in placed} == {0, 1}, "nginx sent every connection to one gateway"
        thread_id = await new_thread(placed[0][0], "gateway stop")
        for follower, _ in placed:
            await follower.subscribe(thread_id)
        text = long_text(120, "gw")
        run_id = await send(placed[0][0], thread_id, text)
        for follower, _ in placed:
            await follower.wait_for(lambda f: len(f.chunks(run_id)) >= 5, 30)

        stopped = placed[0][1]
        await asyncio.to_thread(docker, "stop", "-t", "20", gateways[stopped])
        moved = [f for f, g in placed if g == stopped]
        stayed = [f for f, g in placed if g != stopped]
        reconnected: list[Follower] = []
        for follower in moved:
            await follower.wait_for(lambda f: f.close_code is not None, 30)
            assert follower.close_code in (1001, 1012), follower.close_code
            # As the browser client does: reconnect (through nginx), resubscribe, refetch.
            again = client(stack, tokens["alice"], f"{follower.name}-again")
            placed.append((again, -1))
            await again.__aenter__()
            await again.subscribe(thread_id)
            reconnected.append(again)
        final = await wait_run(stayed[0], run_id, ("completed",))
        for follower in [*stayed, *reconnected]:
            await follower.converge(final)
        for follower in stayed:
            assert follower.close_code is None, follower.name
        assert assistant_text(final) == f"You said: {text}"
        # The stopped gateway stayed down: the reconnections went to the other one.
        assert stack.state(gateways[stopped], ".State.Running") == "false"
    finally:
        for follower, _ in placed:
            with contextlib.suppress(Exception):
                await follower.__aexit__(None, None, None)
        docker("start", *gateways, check=False)


def test_no_token_in_any_log(stack: Stack, tokens: dict[str, str]) -> None:
    # nginx refuses a body over client_max_body_size itself and writes the request line, with
    # its ?token=, to the error log: the line must reach the container log redacted.
    response = httpx.post(
        f"{stack.url}/v1/threads?token={tokens['bob']}",
        content=b"x" * (3 * 1024 * 1024),
        timeout=30,
    )
    assert response.status_code == 413
    (lb,) = stack.containers("lb")
    deadline = time.monotonic() + 10
    while "client intended to send too large body" not in stack.logs(lb):
        assert time.monotonic() < deadline, stack.logs(lb)[-2000:]
        time.sleep(0.2)
    assert "/v1/threads?token=[redacted]" in stack.logs(lb)

    logs = stack.all_logs()
    assert "[accepted]" in logs  # the logs are really there
    for value in stack.issued:
        assert value not in logs
    leaked = re.findall(r"token=(?!\[redacted\])[^\s&\"]{4,}", logs)
    assert not leaked, leaked[:5]
