"""Issuer keys and claim mapping (server.oidc) over httpx's mock transport: no network."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from pydantic import ValidationError

from runtime.domain import Role
from runtime.errors import Unavailable
from server.auth_errors import InvalidSignature, InvalidToken, TokenExpired
from server.oidc import Issuers, OIDCIssuer
from server.settings import Settings

ISSUER = "https://id.example.test"
AUDIENCE = "api://threadline"


def private_key(kid: str) -> dict[str, Any]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(key))
    jwk.update(kid=kid, alg="RS256", use="sig")
    return jwk


def public(jwk: dict[str, Any]) -> dict[str, Any]:
    return {k: jwk[k] for k in ("kty", "n", "e", "kid", "alg", "use")}


class FakeIssuer:
    """Discovery and JWKS over a mock transport, counting requests; `down` fails them."""

    def __init__(self) -> None:
        self.keys = [private_key("k1")]
        self.requests: list[str] = []
        self.down = False

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request.url.path)
        if self.down:
            return httpx.Response(503)
        if request.url.path == "/.well-known/openid-configuration":
            return httpx.Response(200, json={"issuer": ISSUER, "jwks_uri": f"{ISSUER}/jwks"})
        return httpx.Response(200, json={"keys": [public(k) for k in self.keys]})

    def sign(self, kid: str | None = None, **claims: Any) -> str:
        jwk = next(k for k in self.keys if kid in (None, k["kid"]))
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "u1", "exp": now + 60, "groups": "a b"}
        body.update(claims)
        key = RSAAlgorithm.from_jwk(json.dumps(jwk))
        assert isinstance(key, rsa.RSAPrivateKey)  # the fake's JWKs carry the private part
        return jwt.encode(body, key, algorithm="RS256", headers={"kid": jwk["kid"]})


def issuers(fake: FakeIssuer, min_refresh: float = 3600.0, **config: Any) -> Issuers:
    settings = OIDCIssuer(issuer=ISSUER, audience=AUDIENCE, scopes_claim="groups", **config)
    client = httpx.AsyncClient(transport=httpx.MockTransport(fake.handle))
    return Issuers([settings], leeway=0, min_refresh=min_refresh, client=client)


async def test_forged_kids_refetch_the_keys_at_most_once_per_interval() -> None:
    fake = FakeIssuer()
    async with issuers(fake) as trusted:
        assert (await trusted.verify(fake.sign())).principal.subject == "u1"
        fetched = len(fake.requests)
        forged = fake.sign().split(".")
        header = jwt.utils.base64url_encode(b'{"alg":"RS256","kid":"nope"}').decode()
        for _ in range(20):
            with pytest.raises(InvalidSignature):
                await trusted.verify(".".join([header, *forged[1:]]))
        assert len(fake.requests) == fetched  # within min_refresh: no request at all


async def test_an_unknown_kid_refetches_once_the_interval_passed() -> None:
    fake = FakeIssuer()
    async with issuers(fake, min_refresh=0) as trusted:
        await trusted.verify(fake.sign())
        fake.keys = [private_key("k2")]
        verified = await trusted.verify(fake.sign("k2"))
        assert verified.principal.scopes == frozenset({"a", "b"})
        assert fake.requests.count("/jwks") == 2
        assert fake.requests.count("/.well-known/openid-configuration") == 1


async def test_known_keys_keep_verifying_while_the_issuer_is_down() -> None:
    fake = FakeIssuer()
    async with issuers(fake, min_refresh=0) as trusted:
        await trusted.verify(fake.sign())
        fake.down = True
        assert (await trusted.verify(fake.sign())).principal.subject == "u1"
    cold = FakeIssuer()
    cold.down = True
    async with issuers(cold) as never_loaded:
        with pytest.raises(Unavailable):
            await never_loaded.verify(cold.sign())


async def test_claims_map_onto_the_principal() -> None:
    fake = FakeIssuer()
    async with issuers(fake, role_claim="r", name_claim="nm") as trusted:
        verified = await trusted.verify(fake.sign(r="admin", nm="Ann", groups=["x"]))
        principal = verified.principal
        assert (principal.role, principal.name, principal.scopes) == (
            Role.ADMIN,
            "Ann",
            frozenset({"x"}),
        )
        with pytest.raises(InvalidToken):
            await trusted.verify(fake.sign(r="root"))
        with pytest.raises(InvalidToken):
            await trusted.verify(fake.sign(groups=[]))
        with pytest.raises(TokenExpired):
            await trusted.verify(fake.sign(exp=int(time.time()) - 1))


@pytest.mark.parametrize("algorithms", [["none"], ["HS256"], ["RS256", "HS512"], []])
def test_settings_refuse_symmetric_and_none_algorithms(algorithms: list[str]) -> None:
    entry = {"issuer": ISSUER, "audience": AUDIENCE, "scope": "s", "algorithms": algorithms}
    with pytest.raises(ValidationError):
        Settings(oidc_issuers=[entry])


def test_an_issuer_needs_exactly_one_source_of_scopes() -> None:
    with pytest.raises(ValidationError):
        OIDCIssuer(issuer=ISSUER, audience=AUDIENCE)
    with pytest.raises(ValidationError):
        OIDCIssuer(issuer=ISSUER, audience=AUDIENCE, scope="s", scopes_claim="groups")
