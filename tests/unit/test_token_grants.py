"""Who may refresh a websocket's token (server.auth.Grant), and the browser sign-in setting."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from runtime.domain import Principal, Role
from server.auth import Grant
from server.auth_errors import TokenMismatch
from server.settings import Settings

ISSUER = "https://id.example.test"


def grant(issuer: str = ISSUER, **changes: object) -> Grant:
    fields: dict[str, object] = {
        "subject": "ann",
        "role": Role.USER,
        "scopes": frozenset({"alpha", "beta"}),
    }
    fields.update(changes)
    return Grant(Principal.model_validate(fields), "h", issuer, 60.0)


def test_the_same_holder_may_refresh_and_brings_a_new_name_and_groups() -> None:
    grant().check_successor(grant(display_name="Ann Lee", groups=frozenset({"finance"})))
    grant("").check_successor(grant(""))  # tl_ to tl_


@pytest.mark.parametrize(
    "fresh",
    [
        grant(subject="bob"),
        grant(role=Role.ADMIN),
        grant(scopes=frozenset({"alpha"})),  # narrower
        grant(scopes=frozenset({"alpha", "beta", "gamma"})),  # wider
        grant(""),  # a tl_ token of the same subject
        grant("https://other.example.test"),  # another issuer's same subject
    ],
    ids=["subject", "role", "narrower", "wider", "tl_ kind", "issuer"],
)
def test_another_holder_is_a_mismatch(fresh: Grant) -> None:
    with pytest.raises(TokenMismatch):
        grant().check_successor(fresh)


def test_answer_says_when_the_token_expires() -> None:
    answer = grant().answer()
    assert answer["subject"] == "ann" and answer["expires_in"] == 60.0
    never = Grant(grant().principal, "h", "", None).answer()
    assert never["expires_in"] is None and never["expires_at"] is None


def test_the_browser_sign_in_must_name_a_trusted_issuer(monkeypatch: pytest.MonkeyPatch) -> None:
    issuers = [{"issuer": ISSUER, "audience": "api", "scope": "alpha"}]
    monkeypatch.setenv("THREADLINE_OIDC_ISSUERS", json.dumps(issuers))
    monkeypatch.setenv(
        "THREADLINE_OIDC_BROWSER", json.dumps({"issuer": ISSUER, "client_id": "web"})
    )
    sign_in = Settings().oidc_browser
    assert sign_in is not None and sign_in.scopes == "openid offline_access"
    monkeypatch.setenv(
        "THREADLINE_OIDC_BROWSER", json.dumps({"issuer": "https://x.test", "client_id": "web"})
    )
    with pytest.raises(ValidationError, match="not in OIDC_ISSUERS"):
        Settings()
