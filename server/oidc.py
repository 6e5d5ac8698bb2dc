"""JWT bearer tokens from OIDC issuers: keys from discovery and JWKS, claims to a Principal."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runtime.domain import Principal, Role
from runtime.errors import Unavailable
from server.auth_errors import (
    InvalidAudience,
    InvalidIssuer,
    InvalidSignature,
    InvalidToken,
    TokenExpired,
    TokenNotYetValid,
    UnsupportedAlgorithm,
)

log = logging.getLogger(__name__)

# Asymmetric algorithms only: an HS* token would be checked against a key the issuer publishes
# (the classic confusion attack), and `none` is no signature at all. Refused in settings too.
ASYMMETRIC = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
# A JWT longer than this is refused before any parsing (headers bound it lower in practice).
MAX_JWT_CHARS = 16 * 1024
MAX_SUBJECT_CHARS = 200
_FETCH_TIMEOUT = 5.0


class OIDCIssuer(BaseModel):
    """One trusted issuer and how its claims map onto a Principal (docs/operations.md, "OIDC")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    issuer: str = Field(min_length=1)
    # The token's `aud` must name one of these (the API's identifier at the issuer).
    audience: list[str] = Field(min_length=1)
    algorithms: list[str] = Field(default_factory=lambda: ["RS256", "PS256", "ES256", "EdDSA"])
    subject_claim: str = "sub"
    name_claim: str | None = "name"
    # Scopes: a claim holding a list or a space-separated string, or one fixed scope.
    scopes_claim: str | None = None
    scope: str | None = None
    # Role: a claim holding user|backend|admin, else the fixed role.
    role_claim: str | None = None
    role: Role = Role.USER

    @field_validator("audience", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("algorithms")
    @classmethod
    def _asymmetric(cls, value: list[str]) -> list[str]:
        refused = [name for name in value if name not in ASYMMETRIC]
        if refused or not value:
            raise ValueError(
                f"algorithms must be asymmetric ones of {sorted(ASYMMETRIC)}; refused: {refused}"
            )
        return value

    @model_validator(mode="after")
    def _has_scopes(self) -> OIDCIssuer:
        if (self.scopes_claim is None) == (self.scope is None):
            raise ValueError("set exactly one of scopes_claim and scope")
        return self


class BrowserSignIn(BaseModel):
    """The browser client's sign-in at one issuer (authorization code + PKCE, a public client):
    public values only, given to the page (docs/operations.md, "Browser sign-in")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    issuer: str = Field(min_length=1)
    client_id: str = Field(min_length=1)
    # `offline_access` asks for a refresh token, which is how the page renews its access token.
    scopes: str = "openid offline_access"
    # Extra authorization request parameters the issuer needs for an access token meant for
    # this API: `{"resource": …}` (RFC 8707) or `{"audience": …}` (Auth0), `{"prompt": …}`.
    params: dict[str, str] = Field(default_factory=dict)


@dataclass(frozen=True)
class VerifiedToken:
    principal: Principal
    expires_at: float  # wall-clock seconds (the token's `exp`)
    issuer: str = ""


class IssuerKeys:
    """The signing keys one issuer publishes, fetched through its discovery document.

    Cached for `max_age` seconds; a token naming an unknown `kid` refetches (the issuer rotated
    its keys), at most once per `min_refresh` seconds so forged `kid`s cannot hammer the issuer.
    Concurrent fetches share one request.
    """

    def __init__(
        self, issuer: str, client: httpx.AsyncClient, *, max_age: float, min_refresh: float
    ) -> None:
        self.issuer = issuer
        self._client = client
        self._max_age = max_age
        self._min_refresh = min_refresh
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._loaded_at: float | None = None
        self._attempted_at = float("-inf")
        self._jwks_uri: str | None = None
        self._lock = asyncio.Lock()

    async def key(self, kid: str | None) -> jwt.PyJWK:
        now = time.monotonic()
        if self._loaded_at is None or now - self._loaded_at > self._max_age:
            await self._refresh(force=self._loaded_at is None)
        found = self._find(kid)
        if found is None and time.monotonic() - self._attempted_at >= self._min_refresh:
            await self._refresh(force=False)
            found = self._find(kid)
        if found is None:
            raise InvalidSignature(f"the issuer publishes no key {kid!r}")
        return found

    def _find(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is not None or len(self._keys) != 1:
            return self._keys.get(kid)
        return next(iter(self._keys.values()))  # no kid, and only one key to try

    async def _refresh(self, *, force: bool) -> None:
        attempted = self._attempted_at
        async with self._lock:
            if self._attempted_at != attempted:
                return  # another request fetched while this one waited
            self._attempted_at = time.monotonic()
            try:
                self._keys = await self._fetch()
                self._loaded_at = time.monotonic()
            except (httpx.HTTPError, ValueError, jwt.PyJWTError) as exc:
                log.warning("fetching the keys of %s failed: %s", self.issuer, exc)
                if force or not self._keys:
                    raise Unavailable(f"the keys of issuer {self.issuer} are unavailable") from exc
                # Stale keys still verify what they signed; an unknown kid stays refused.

    async def _fetch(self) -> dict[str | None, jwt.PyJWK]:
        if self._jwks_uri is None:
            url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
            response = await self._client.get(url)
            response.raise_for_status()
            discovery = response.json()
            if discovery.get("issuer") != self.issuer:
                raise ValueError(f"discovery names issuer {discovery.get('issuer')!r}")
            self._jwks_uri = str(discovery["jwks_uri"])
        response = await self._client.get(self._jwks_uri)
        response.raise_for_status()
        keys: dict[str | None, jwt.PyJWK] = {}
        for data in response.json().get("keys", []):
            if data.get("use", "sig") != "sig" or data.get("kty") == "oct":
                continue  # encryption keys, and symmetric ones, never verify our tokens
            try:
                keys[data.get("kid")] = jwt.PyJWK(data)
            except jwt.PyJWTError as exc:
                log.info("skipping a key of %s: %s", self.issuer, exc)
        return keys


class Issuers:
    """Every configured issuer: verifies a JWT and maps its claims (async with: the client)."""

    def __init__(
        self,
        configs: Sequence[OIDCIssuer],
        *,
        leeway: float = 30.0,
        max_age: float = 600.0,
        min_refresh: float = 30.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.configs = {config.issuer: config for config in configs}
        self.leeway = leeway
        self._client = client or httpx.AsyncClient(timeout=_FETCH_TIMEOUT, follow_redirects=False)
        self._keys = {
            issuer: IssuerKeys(issuer, self._client, max_age=max_age, min_refresh=min_refresh)
            for issuer in self.configs
        }

    async def __aenter__(self) -> Issuers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.aclose()

    async def verify(self, token: str) -> VerifiedToken:
        """The principal a valid token names; an `Unauthorized` subclass saying why not."""
        if len(token) > MAX_JWT_CHARS:
            raise InvalidToken("the token is too long")
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError as exc:
            raise InvalidToken("the token is not a well-formed JWT") from exc
        config = self.configs.get(str(unverified.get("iss", "")))
        if config is None:
            raise InvalidIssuer("the token's issuer is not trusted here")
        algorithm = header.get("alg")
        if algorithm not in config.algorithms:
            raise UnsupportedAlgorithm(f"algorithm {algorithm!r} is not accepted")
        kid = header.get("kid")
        key = await self._keys[config.issuer].key(kid if isinstance(kid, str) else None)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=config.audience,
                issuer=config.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise TokenExpired("the token has expired") from exc
        except jwt.ImmatureSignatureError as exc:
            raise TokenNotYetValid("the token is not valid yet") from exc
        except jwt.InvalidAudienceError as exc:
            raise InvalidAudience("the token is not meant for this server") from exc
        except jwt.InvalidIssuerError as exc:
            raise InvalidIssuer("the token's issuer is not trusted here") from exc
        except (jwt.InvalidSignatureError, jwt.InvalidAlgorithmError, jwt.InvalidKeyError) as exc:
            raise InvalidSignature("the token's signature does not verify") from exc
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"the token is invalid: {exc}") from exc
        return VerifiedToken(principal_of(config, claims), float(claims["exp"]), config.issuer)


def principal_of(config: OIDCIssuer, claims: dict[str, Any]) -> Principal:
    """The claim mapping of `config`; `InvalidToken` when a mapped claim is missing or odd."""
    subject = claims.get(config.subject_claim)
    if not isinstance(subject, str) or not 0 < len(subject) <= MAX_SUBJECT_CHARS:
        raise InvalidToken(f"claim {config.subject_claim!r} must be a non-empty string")
    if config.scope is not None:
        scopes = frozenset({config.scope})
    else:
        assert config.scopes_claim is not None
        raw = claims.get(config.scopes_claim)
        values = raw.split() if isinstance(raw, str) else raw
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise InvalidToken(f"claim {config.scopes_claim!r} must list the token's scopes")
        scopes = frozenset(values)
        if not scopes:
            raise InvalidToken(f"claim {config.scopes_claim!r} names no scope")
    role = config.role
    if config.role_claim is not None and config.role_claim in claims:
        try:
            role = Role(claims[config.role_claim])
        except ValueError as exc:
            raise InvalidToken(f"claim {config.role_claim!r} is not a role") from exc
    name = claims.get(config.name_claim) if config.name_claim else None
    display_name = name[:MAX_SUBJECT_CHARS] if isinstance(name, str) and name else None
    # A `groups` claim (a list of names, as most issuers send it) names the caller's groups:
    # what approval policies route by. Anything else is no group, never a refusal.
    raw_groups = claims.get("groups")
    groups = (
        frozenset(g for g in raw_groups if isinstance(g, str))
        if isinstance(raw_groups, list)
        else frozenset()
    )
    return Principal(
        subject=subject,
        role=role,
        scopes=scopes,
        display_name=display_name,
        groups=groups,
        claims=dict(claims),
    )
