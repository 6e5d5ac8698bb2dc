"""Token management: `threadline token list` / `revoke --id` and the admin routes, on a server."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from server.transports.ws.gateway import TOKEN_RECHECK_INTERVAL
from tests.e2e import harness

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("token-admin")


@pytest.fixture(scope="module")
def server(directory: Path) -> Iterator[harness.ServerHandle]:
    env = harness.server_env(harness.sqlite_url(directory), {"THREADLINE_DEV_TOKEN": "false"})
    with harness.start("all", env, log_dir=directory) as handle:
        yield handle


def listed(server: harness.ServerHandle) -> list[dict[str, Any]]:
    done = harness.run_command(["token", "list", "--json"], server.env)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def call(server: harness.ServerHandle, method: str, path: str, token: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.request(method, f"{server.url}{path}", headers=headers, timeout=TIMEOUT)


def test_list_shows_every_field_but_never_the_secret(
    server: harness.ServerHandle, directory: Path
) -> None:
    token = server.token("alpha", "user", "lister", name="Lister")
    [entry] = [t for t in listed(server) if t["subject"] == "lister"]
    assert set(entry) == {
        "id",
        "subject",
        "role",
        "scopes",
        "name",
        "groups",
        "created_at",
        "expires_at",
        "last_used_at",
    }
    assert (entry["role"], entry["scopes"], entry["name"]) == ("user", ["alpha"], "Lister")
    assert entry["last_used_at"] is None and entry["expires_at"] is None
    assert call(server, "GET", "/v1/me", token).status_code == 200
    [used] = [t for t in listed(server) if t["id"] == entry["id"]]
    assert used["last_used_at"] >= entry["created_at"]
    table = harness.run_command(["token", "list"], server.env).stdout
    assert "LAST USED" in table and entry["id"] in table
    # The stored form is a hash: neither the output nor the database holds the token.
    assert token not in table and token[3:] not in json.dumps(listed(server))
    with sqlite3.connect(directory / "threadline.sqlite3") as db:
        rows = db.execute("SELECT * FROM api_tokens").fetchall()
    assert rows and all(token not in str(row) for row in rows)


def test_admins_list_and_revoke_by_id_within_their_scopes(server: harness.ServerHandle) -> None:
    admin = server.token(["alpha", "beta"], "admin", "root")
    victim = server.token("alpha", "user", "victim")
    outsider = server.token("gamma", "user", "outsider")
    tokens = call(server, "GET", "/v1/tokens", admin).json()["tokens"]
    subjects = {t["subject"] for t in tokens}
    assert {"root", "victim"} <= subjects and "outsider" not in subjects
    refused = call(server, "GET", "/v1/tokens", victim)
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")

    ids = {t["subject"]: t["id"] for t in listed(server)}
    with connect(f"{server.ws_url}?token={victim}", open_timeout=TIMEOUT) as ws:
        ws.send('{"type": "ping", "id": 1}')
        ws.recv(timeout=TIMEOUT)
        # A user may not revoke; an admin may not revoke outside their scopes.
        denied = call(server, "POST", f"/v1/tokens/{ids['victim']}/revoke", victim)
        assert denied.status_code == 403
        foreign = call(server, "POST", f"/v1/tokens/{ids['outsider']}/revoke", admin)
        assert (foreign.status_code, foreign.json()["error"]["code"]) == (404, "not_found")
        bad = call(server, "POST", "/v1/tokens/not-an-id/revoke", admin)
        assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_input")
        assert call(server, "GET", "/v1/me", victim).status_code == 200
        done = call(server, "POST", f"/v1/tokens/{ids['victim']}/revoke", admin)
        assert done.status_code == 200, done.text
        assert done.json()["subject"] == "victim"
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=TIMEOUT)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
    assert call(server, "GET", "/v1/me", victim).status_code == 401
    assert call(server, "GET", "/v1/me", outsider).status_code == 200
    assert "victim" not in {t["subject"] for t in listed(server)}


def test_the_cli_revokes_by_id(server: harness.ServerHandle) -> None:
    token = server.token("alpha", "backend", "retiring")
    [entry] = [t for t in listed(server) if t["subject"] == "retiring"]
    done = harness.run_command(["token", "revoke", "--id", entry["id"]], server.env)
    assert done.returncode == 0, done.stderr
    assert call(server, "GET", "/v1/me", token).status_code == 401
    again = harness.run_command(["token", "revoke", "--id", entry["id"]], server.env)
    assert again.returncode != 0 and "no such active token" in again.stderr
    both = harness.run_command(["token", "revoke", token, "--id", entry["id"]], server.env)
    assert both.returncode != 0


def _pinged(ws: Any) -> None:
    ws.send('{"type": "ping", "id": 1}')
    ws.recv(timeout=TIMEOUT)


def _closed_code(ws: Any) -> int | None:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=TIMEOUT)
    return None if closed.value.rcvd is None else closed.value.rcvd.code


def test_a_revocation_no_message_announces_closes_its_sockets_at_the_recheck(
    server: harness.ServerHandle,
) -> None:
    # The CLI against a server without Redis: no bus carries the revocation to the server, so
    # only the gateway's periodic recheck (one row read while nothing is revoked) finds it.
    keeper = server.token("alpha", "user", "keeper")
    first, second, third = (server.token("alpha", "user", f"revoked-{n}") for n in (1, 2, 3))

    def revoke(token: str) -> None:
        done = harness.run_command(["token", "revoke", token], server.env)
        assert done.returncode == 0, done.stderr

    url = f"{server.ws_url}?token="
    with (
        connect(url + keeper, open_timeout=TIMEOUT) as kept,
        connect(url + first, open_timeout=TIMEOUT) as one,
        connect(url + second, open_timeout=TIMEOUT) as two,
    ):
        for ws in (kept, one, two):
            _pinged(ws)
        time.sleep(TOKEN_RECHECK_INTERVAL + 1)  # a recheck has found all three live
        revoke(first)  # the count moves: every open token is read again
        assert _closed_code(one) == 4403
        _pinged(two)
        # A connection opened since is read at the next recheck, whatever the count.
        with connect(url + third, open_timeout=TIMEOUT) as late:
            _pinged(late)
            revoke(third)
            assert _closed_code(late) == 4403
        revoke(second)  # and the count moves again
        assert _closed_code(two) == 4403
        _pinged(kept)
