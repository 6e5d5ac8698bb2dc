"""A live socket follows its token: closed at the token's expiry unless it sends `auth.refresh`
with a fresher one of the same holder (tokens from a real issuer, oidc-provider, and `tl_`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from realtime.closecodes import CloseCode
from tests.e2e import harness, jsclients
from tests.e2e.oidc import Provider, issuer_config
from threadline_client import ThreadlineClient, jwt_expiry

TIMEOUT = 10.0
TTL = 3  # seconds the provider's `short` tokens live
SHORT = {
    "client_id": "short",
    "client_secret": "short-secret",
    "ttl": TTL,
    "claims": {"tl_scopes": ["alpha"]},
}
OTHER = {"client_id": "other", "client_secret": "other-secret", "claims": {"tl_scopes": ["alpha"]}}


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("refresh")


@pytest.fixture(scope="module")
def provider(directory: Path) -> Iterator[Provider]:
    issuer = Provider(jsclients.require_node_clients(), directory, [SHORT, OTHER])
    try:
        yield issuer
    finally:
        issuer.close()


@pytest.fixture(scope="module")
def server(directory: Path, provider: Provider) -> Iterator[harness.ServerHandle]:
    env = harness.server_env(
        harness.sqlite_url(directory),
        # No leeway: a socket closes at the token's `exp` itself.
        {"THREADLINE_OIDC_ISSUERS": json.dumps([issuer_config(provider)])}
        | {"THREADLINE_OIDC_LEEWAY": "0"},
    )
    with harness.start("all", env, log_dir=directory) as handle:
        yield handle


def short_token(provider: Provider) -> tuple[str, float]:
    token = provider.token("short", "short-secret")
    exp = float(jwt.decode(token, options={"verify_signature": False})["exp"])
    return token, exp


def open_socket(server: harness.ServerHandle, token: str) -> ClientConnection:
    return connect(
        server.ws_url,
        subprotocols=["threadline.v1", f"bearer.{token}"],  # type: ignore[list-item]
        open_timeout=TIMEOUT,
    )


def request(ws: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    """Send `frame` and return its answer (frames of other kinds are skipped)."""
    ws.send(json.dumps(frame))
    for _ in range(100):
        answer: dict[str, Any] = json.loads(ws.recv(timeout=TIMEOUT))
        if answer.get("id") == frame["id"]:
            return answer
    raise AssertionError(f"no answer to {frame['type']}")


def close_code(ws: ClientConnection, within: float) -> int | None:
    """The close code the server sends within `within` seconds (frames meanwhile skipped)."""
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            ws.recv(timeout=max(0.01, deadline - time.monotonic()))
    except TimeoutError:
        return None
    except ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd is not None else None
    return None


def create_thread(server: harness.ServerHandle, token: str) -> str:
    created = httpx.post(
        f"{server.url}/v1/threads",
        json={"title": "refresh"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=TIMEOUT,
    )
    assert created.status_code == 201, created.text
    return str(created.json()["thread"]["id"])


def test_a_socket_closes_at_its_token_s_expiry(
    server: harness.ServerHandle, provider: Provider
) -> None:
    token, exp = short_token(provider)
    with open_socket(server, token) as ws:
        assert request(ws, {"type": "ping", "id": 1}) == {"type": "pong", "id": 1}
        code = close_code(ws, within=TTL + 5)
        closed_at = time.time()
    assert code == CloseCode.TOKEN_REVOKED
    # Not before `exp` (the server's and this machine's clock are one clock here).
    assert closed_at >= exp - 0.05, (closed_at, exp)


def test_a_socket_that_refreshes_stays_open_and_keeps_receiving(
    server: harness.ServerHandle, provider: Provider
) -> None:
    first, first_exp = short_token(provider)
    thread_id = create_thread(server, first)
    with open_socket(server, first) as ws:
        subscribed = request(ws, {"type": "subscribe", "thread_id": thread_id, "id": "s"})
        assert subscribed["type"] == "subscribed", subscribed
        time.sleep(max(0.0, first_exp - time.time() - 1.5))
        second, second_exp = short_token(provider)
        assert second_exp > first_exp, "the provider issued the same exp: nothing to refresh"
        ack = request(ws, {"type": "auth.refresh", "token": second, "id": "r"})
        assert ack["type"] == "ack" and ack["subject"] == "short", ack
        assert ack["expires_at"] == pytest.approx(second_exp, abs=1.0)
        assert 0 < ack["expires_in"] <= TTL
        # Past the first token's expiry: open, and live frames still arrive.
        assert close_code(ws, within=max(0.0, first_exp - time.time()) + 0.5) is None
        sent = httpx.post(
            f"{server.url}/v1/threads/{thread_id}/messages",
            json={"text": "still here"},
            headers={"Authorization": f"Bearer {second}"},
            timeout=TIMEOUT,
        )
        assert sent.status_code == 202, sent.text
        kinds = set()
        for _ in range(200):
            frame = json.loads(ws.recv(timeout=TIMEOUT))
            kinds.add(frame["type"])
            if frame["type"] == "invalidate" and frame["version"] > subscribed["version"]:
                break
        assert {"invalidate"} <= kinds, kinds
        # The new token's expiry is armed: the socket closes at it.
        code = close_code(ws, within=TTL + 5)
        closed_at = time.time()
    assert code == CloseCode.TOKEN_REVOKED
    assert closed_at >= second_exp - 0.05, (closed_at, second_exp)


def test_refusals_change_nothing(server: harness.ServerHandle, provider: Provider) -> None:
    tl_same_subject = server.token("alpha", "user", "short")
    refusals = {
        "expired": (provider.sign(provider.claims(sub="short", exp=int(time.time()) - 5)), None),
        "other subject": (provider.token("other", "other-secret"), "token_mismatch"),
        "wider scopes": (
            provider.sign(provider.claims(sub="short", tl_scopes=["alpha", "beta"])),
            "token_mismatch",
        ),
        "another role": (
            provider.sign(provider.claims(sub="short", tl_role="admin")),
            "token_mismatch",
        ),
        "a tl_ token of the same subject": (tl_same_subject, "token_mismatch"),
        "garbage": ("tl_not-a-token", "unauthorized"),
    }
    token, _ = short_token(provider)  # last: it lives TTL seconds
    with open_socket(server, token) as ws:
        for case, (bad, refusal) in refusals.items():
            answer = request(ws, {"type": "auth.refresh", "token": bad, "id": case})
            assert answer["type"] == "error", (case, answer)
            assert answer["code"] == (refusal or "token_expired"), (case, answer)
        assert request(ws, {"type": "ping", "id": 2}) == {"type": "pong", "id": 2}
        # The connect token still rules: closed at its expiry, none of the above re-armed it.
        code = close_code(ws, within=TTL + 5)
    assert code == CloseCode.TOKEN_REVOKED


def test_a_tl_socket_refreshes_to_another_tl_token_and_follows_it(
    server: harness.ServerHandle,
) -> None:
    longer = mint(server)
    short = mint(server, "--expires-in", "3")  # last: its clock runs from the mint
    with open_socket(server, short) as ws:
        # The current token, to learn when it expires.
        current = request(ws, {"type": "auth.refresh", "token": short, "id": 1})
        assert current["type"] == "ack" and 0 < current["expires_in"] <= 3, current
        ack = request(ws, {"type": "auth.refresh", "token": longer, "id": 2})
        assert ack["type"] == "ack" and "expires_in" not in ack, ack  # never expires
        # Past the short token's expiry.
        assert close_code(ws, within=current["expires_in"] + 0.5) is None
        # Revoking the token it runs on now closes it.
        revoked = harness.run_command(["token", "revoke", longer], server.env)
        assert revoked.returncode == 0, revoked.stderr
        assert close_code(ws, within=TIMEOUT) == CloseCode.TOKEN_REVOKED


def mint(server: harness.ServerHandle, *extra: str) -> str:
    """A `tl_` token of subject `tl-refresher`, scope alpha (same holder every time)."""
    args = ["token", "create", "--scope", "alpha", "--subject", "tl-refresher", *extra]
    done = harness.run_command(args, server.env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def completed(watch: Any) -> bool:
    """The watched thread's run completed (the Python client's watch)."""
    run = None if watch.snapshot is None else watch.snapshot.run
    return run is not None and run.status == "completed"


async def test_the_python_client_refreshes_a_watch_s_jwt_before_each_expiry(
    server: harness.ServerHandle, provider: Provider
) -> None:
    calls = 0

    async def fetch() -> str:  # an async provider: the issuer's client credentials grant
        nonlocal calls
        calls += 1
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            answer = await http.post(
                f"{provider.issuer}/token",
                data={"grant_type": "client_credentials", "scope": "threadline"},
                auth=("short", "short-secret"),
            )
        return str(answer.json()["access_token"])

    async with ThreadlineClient(server.url, token_provider=fetch) as tl:
        thread = await tl.create_thread(title="watched")
        async with tl.watch(thread.thread.id) as watch:
            await watch.until(lambda w: w.snapshot is not None, timeout=TIMEOUT)
            first_exp = jwt_expiry(tl.token)
            assert first_exp is not None
            # Two token lifetimes: the socket would have closed twice without refreshes.
            await asyncio.sleep(max(0.0, first_exp - time.time()) + TTL + 0.5)
            await tl.send(thread.thread.id, "after the refreshes")
            done = await watch.until(completed, timeout=TIMEOUT)
            assert done.connections == 1, "the watch reconnected instead of refreshing"
    assert calls >= 3, calls  # the first token, then one per expiry


async def test_the_python_client_learns_a_tl_token_s_expiry_from_the_server(
    server: harness.ServerHandle,
) -> None:
    forever = mint(server)
    lifetime = 5.0
    short = mint(server, "--expires-in", str(int(lifetime)))  # last: its clock runs already
    minted = time.monotonic()
    handed = [short, forever]

    def next_token() -> str:  # a sync provider
        return handed.pop(0) if len(handed) > 1 else handed[0]

    async with ThreadlineClient(server.url, token_provider=next_token) as tl:
        thread = await tl.create_thread(title="tl watched")
        assert tl.token == short
        async with tl.watch(thread.thread.id) as watch:
            await watch.until(lambda w: w.snapshot is not None, timeout=TIMEOUT)
            await asyncio.sleep(max(0.0, minted + lifetime + 1.0 - time.monotonic()))
            assert tl.token == forever  # the provider was asked before the expiry
            await tl.send(thread.thread.id, "past the first token")
            done = await watch.until(completed, timeout=TIMEOUT)
            assert done.connections == 1, "the watch reconnected instead of refreshing"


async def test_an_http_call_refused_for_an_expired_tl_token_is_retried_with_a_fresh_one(
    server: harness.ServerHandle,
) -> None:
    forever = mint(server)
    short = mint(server, "--expires-in", "1")
    handed = [short, forever]

    async with ThreadlineClient(server.url, token_provider=lambda: handed.pop(0)) as tl:
        assert (await tl.me()).subject == "tl-refresher"
        assert tl.token == short
        await asyncio.sleep(1.5)  # past the expiry, which only the server knows
        assert (await tl.me()).subject == "tl-refresher"
        assert tl.token == forever and not handed
