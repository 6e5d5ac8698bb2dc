"""JWTs from a real OIDC issuer (oidc-provider) beside `tl_` tokens, on HTTP, websocket and SSE."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.e2e import harness, jsclients
from tests.e2e.oidc import AUDIENCE, Provider, issuer_config, new_key
from tests.e2e.run_inputs import agui_input

TIMEOUT = 10.0
SVC = {"client_id": "svc", "client_secret": "svc-secret", "claims": {"tl_scopes": ["alpha"]}}
NAMED = {
    "client_id": "named",
    "client_secret": "named-secret",
    "claims": {"tl_scopes": ["alpha", "beta"], "name": "Named Service", "tl_role": "backend"},
}


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("oidc")


@pytest.fixture(scope="module")
def provider(directory: Path) -> Iterator[Provider]:
    node = jsclients.require_node_clients()
    issuer = Provider(node, directory, [SVC, NAMED])
    try:
        yield issuer
    finally:
        issuer.close()


@pytest.fixture(scope="module")
def foreign(directory: Path) -> Iterator[Provider]:
    """A second issuer the server was never told about, with a client of the same name."""
    issuer = Provider(jsclients.require_node_clients(), directory, [SVC])
    try:
        yield issuer
    finally:
        issuer.close()


@pytest.fixture(scope="module")
def server(directory: Path, provider: Provider) -> Iterator[harness.ServerHandle]:
    env = harness.server_env(
        harness.sqlite_url(directory),
        {
            "THREADLINE_OIDC_ISSUERS": json.dumps([issuer_config(provider)]),
            "THREADLINE_OIDC_LEEWAY": "2",
            # A rotation is followed at the first token naming the new key.
            "THREADLINE_OIDC_JWKS_MIN_REFRESH": "0",
        },
    )
    with harness.start("all", env, log_dir=directory) as handle:
        yield handle


@pytest.fixture(scope="module")
def auditor(server: harness.ServerHandle) -> str:
    """An admin `tl_` token of scope alpha, to see what refusals left behind."""
    return server.token("alpha", "admin", "auditor")


def get(server: harness.ServerHandle, path: str, token: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{server.url}{path}", headers=headers, timeout=TIMEOUT)


def websocket(server: harness.ServerHandle, token: str) -> ClientConnection:
    headers = {"Authorization": f"Bearer {token}"}
    return connect(server.ws_url, additional_headers=headers, open_timeout=TIMEOUT)


def agui_run(server: harness.ServerHandle, token: str, text: str) -> list[dict[str, Any]]:
    body = agui_input(f"oidc-{uuid.uuid4().hex}", text)
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    events = []
    with httpx.stream(
        "POST", f"{server.url}/v1/ag-ui", json=body, headers=headers, timeout=TIMEOUT
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    return events


def test_a_provider_token_works_on_http_websocket_and_agui(
    server: harness.ServerHandle, provider: Provider
) -> None:
    token = provider.token("named", "named-secret")
    me = get(server, "/v1/me", token)
    assert me.status_code == 200, me.text
    assert me.json() == {
        "subject": "named",
        "role": "backend",
        "scopes": ["alpha", "beta"],
        "name": "Named Service",
    }
    created = httpx.post(
        f"{server.url}/v1/threads",
        json={"title": "by jwt", "scope": "beta"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=TIMEOUT,
    )
    assert created.status_code == 201, created.text
    thread_id = created.json()["thread"]["id"]
    with websocket(server, token) as ws:
        ws.send(json.dumps({"type": "subscribe", "thread_id": thread_id, "id": 1}))
        answer = json.loads(ws.recv(timeout=TIMEOUT))
        assert answer["type"] == "subscribed" and answer["thread_id"] == thread_id
    events = agui_run(server, provider.token("svc", "svc-secret"), "hello over sse")
    types = [event["type"] for event in events]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types
    text = "".join(e.get("delta", "") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "hello over sse" in text
    # `tl_` tokens keep working beside the issuer's.
    assert get(server, "/v1/me", server.token("alpha", "user", "alice")).status_code == 200


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _tampered(token: str) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["tl_scopes"] = ["alpha", "beta", "gamma"]
    return ".".join([header, _b64(json.dumps(claims).encode()), signature])


def _hs256_with_public_key(provider: Provider) -> str:
    # The confusion attack: HMAC keyed with the issuer's published RSA key.
    public = {k: provider.keys[0][k] for k in ("kty", "n", "e")}
    header = _b64(json.dumps({"alg": "HS256", "kid": provider.keys[0]["kid"]}).encode())
    payload = _b64(json.dumps(provider.claims()).encode())
    secret = json.dumps(public).encode()
    mac = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(mac)}"


BadToken = Callable[[Provider, Provider], str]
BAD_TOKENS: dict[str, tuple[BadToken, str]] = {
    "wrong audience": (
        lambda p, f: p.token("svc", "svc-secret", resource="https://other.test/api"),
        "invalid_audience",
    ),
    "unknown issuer": (lambda p, f: f.token("svc", "svc-secret"), "invalid_issuer"),
    "expired": (lambda p, f: p.sign(p.claims(exp=p.claims()["iat"] - 60)), "token_expired"),
    "not yet valid": (
        lambda p, f: p.sign(p.claims(nbf=p.claims()["iat"] + 120)),
        "token_not_yet_valid",
    ),
    "alg none": (
        lambda p, f: jwt.encode(p.claims(), "", algorithm="none"),
        "unsupported_algorithm",
    ),
    "hs256 with the public key": (lambda p, f: _hs256_with_public_key(p), "unsupported_algorithm"),
    "another key, same kid": (
        lambda p, f: p.sign(p.claims(), key={**new_key("x"), "kid": p.keys[0]["kid"]}),
        "invalid_signature",
    ),
    "tampered payload": (lambda p, f: _tampered(p.token("svc", "svc-secret")), "invalid_signature"),
    "not a jwt": (lambda p, f: "a.b.c", "invalid_token"),
    "no scopes claim": (lambda p, f: p.sign(p.claims(tl_scopes=None)), "invalid_token"),
}


@pytest.mark.parametrize("case", sorted(BAD_TOKENS))
def test_each_bad_token_is_refused_with_its_code(
    server: harness.ServerHandle, provider: Provider, foreign: Provider, auditor: str, case: str
) -> None:
    make, code = BAD_TOKENS[case]
    token = make(provider, foreign)
    before = get(server, "/v1/threads", auditor).json()
    refused = get(server, "/v1/me", token)
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"]["code"] == code, refused.text
    assert refused.headers["www-authenticate"] == "Bearer"
    attempt = httpx.post(
        f"{server.url}/v1/threads",
        json={"title": "should not exist"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=TIMEOUT,
    )
    assert (attempt.status_code, attempt.json()["error"]["code"]) == (401, code)
    with websocket(server, token) as ws, pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=TIMEOUT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
    after = get(server, "/v1/threads", auditor).json()
    assert after == before


def test_the_provider_rotates_its_key_and_new_tokens_keep_working(
    server: harness.ServerHandle, provider: Provider
) -> None:
    old = provider.token("svc", "svc-secret")
    assert get(server, "/v1/me", old).status_code == 200
    kid = provider.rotate()
    new = provider.token("svc", "svc-secret")
    assert jwt.get_unverified_header(new)["kid"] == kid
    me = get(server, "/v1/me", new)
    assert me.status_code == 200, me.text
    assert me.json()["subject"] == "svc"
    with websocket(server, new) as ws:
        ws.send('{"type": "ping", "id": 7}')
        assert json.loads(ws.recv(timeout=TIMEOUT)) == {"type": "pong", "id": 7}
    # The old key is no longer published: what it signed is refused from now on.
    stale = get(server, "/v1/me", old)
    assert (stale.status_code, stale.json()["error"]["code"]) == (401, "invalid_signature")
    assert AUDIENCE in jwt.decode(new, options={"verify_signature": False})["aud"]
