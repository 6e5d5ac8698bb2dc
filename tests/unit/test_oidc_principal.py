"""How a verified JWT's claims become a Principal (server/oidc.py's claim mapping)."""

from __future__ import annotations

import pytest

from runtime.domain import Role
from server.auth_errors import InvalidToken
from server.oidc import OIDCIssuer, principal_of

ISSUER = OIDCIssuer(
    issuer="https://idp.test", audience="threadline", scopes_claim="tl_scopes", role_claim="tl_role"
)


def test_claims_map_to_subject_scopes_role_groups_and_are_kept_for_hooks() -> None:
    claims = {
        "sub": "alice",
        "name": "Alice",
        "tl_scopes": "demo finance",
        "tl_role": "backend",
        "groups": ["finance", 7],
        "department": "treasury",
    }
    who = principal_of(ISSUER, claims)
    assert (who.subject, who.display_name, who.role) == ("alice", "Alice", Role.BACKEND)
    assert who.scopes == {"demo", "finance"}
    assert who.groups == {"finance"}  # non-string group names are no group
    assert who.claims["department"] == "treasury"  # what an authorization hook may decide by
    assert "claims" not in who.model_dump()  # never serialised into answers or records


def test_a_token_without_scopes_is_refused() -> None:
    with pytest.raises(InvalidToken):
        principal_of(ISSUER, {"sub": "bob", "tl_scopes": []})
