"""A real OIDC issuer for e2e tests: the npm package oidc-provider (tests/js/oidc_provider.mjs).

The test owns the provider's signing keys (a private JWKS file the provider reads), so it can
rotate them mid-test and also sign tokens the provider would never issue (expired, not yet
valid) with the provider's own key.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from tests.e2e import harness, jsclients

AUDIENCE = "https://threadline.test/api"
START_TIMEOUT = 30.0


def new_key(kid: str) -> dict[str, Any]:
    """A private RSA JWK (RS256) named `kid`."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(key))
    jwk.update(kid=kid, alg="RS256", use="sig")
    return jwk


class Provider:
    """One oidc-provider process on a free loopback port; `close()` stops it."""

    def __init__(self, node: str, directory: Path, clients: list[dict[str, Any]]) -> None:
        self.port = harness.free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.keys_file = directory / f"keys-{self.port}.json"
        self.keys = [new_key("key-1")]
        self._write_keys()
        config = directory / f"provider-{self.port}.json"
        config.write_text(
            json.dumps(
                {
                    "port": self.port,
                    "keys_file": str(self.keys_file),
                    "resource": AUDIENCE,
                    "clients": clients,
                }
            )
        )
        self.log_path = directory / f"provider-{self.port}.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [node, str(jsclients.JS_DIR / "oidc_provider.mjs"), str(config)],
            cwd=jsclients.JS_DIR,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _write_keys(self) -> None:
        self.keys_file.write_text(json.dumps({"keys": self.keys}))

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        url = f"{self.issuer}/.well-known/openid-configuration"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"oidc-provider exited:\n{self.log_path.read_text()}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError(f"oidc-provider not ready:\n{self.log_path.read_text()}")

    def token(self, client_id: str, secret: str, resource: str | None = None) -> str:
        """An access token (a JWT) by the client credentials grant."""
        data = {"grant_type": "client_credentials", "scope": "threadline"}
        if resource is not None:
            data["resource"] = resource
        response = httpx.post(
            f"{self.issuer}/token", data=data, auth=(client_id, secret), timeout=10.0
        )
        assert response.status_code == 200, response.text
        return str(response.json()["access_token"])

    def rotate(self) -> str:
        """Sign with a new key from now on (the old one is no longer published); its kid."""
        kid = f"key-{len(self.keys) + 1}"
        self.keys = [new_key(kid)]
        self._write_keys()
        response = httpx.post(f"{self.issuer}/__rotate", timeout=10.0)
        assert response.status_code == 204, response.text
        return kid

    def sign(self, claims: dict[str, Any], key: dict[str, Any] | None = None) -> str:
        """A token signed with the provider's current key (or `key`), claims as given."""
        jwk = key or self.keys[0]
        private = RSAAlgorithm.from_jwk(json.dumps(jwk))
        assert isinstance(private, rsa.RSAPrivateKey)  # the provider's JWKs carry the private part
        return jwt.encode(claims, private, algorithm="RS256", headers={"kid": jwk["kid"]})

    def claims(self, **overrides: Any) -> dict[str, Any]:
        """Claims like the provider's own tokens, valid for a minute."""
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "aud": AUDIENCE,
            "sub": "crafted",
            "iat": now,
            "exp": now + 60,
            "tl_scopes": ["alpha"],
        }
        claims.update(overrides)
        return claims

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def issuer_config(provider: Provider, **overrides: Any) -> dict[str, Any]:
    """The THREADLINE_OIDC_ISSUERS entry for `provider`: scopes from `tl_scopes`."""
    config: dict[str, Any] = {
        "issuer": provider.issuer,
        "audience": AUDIENCE,
        "scopes_claim": "tl_scopes",
        "role_claim": "tl_role",
    }
    config.update(overrides)
    return config
