"""The command-table rows of token administration and of a socket's own token refresh
(docs/protocol.md, "Tokens", "Token refresh"); `commands` appends them."""

from __future__ import annotations

from typing import Any

from server.protocol.command_model import Command, Http, require_admin
from server.protocol.inputs import NoInput, RefreshToken, RevokeTokenById

# Token administration (docs/protocol.md, "Tokens"): admins of the tokens' scopes only.
TOKEN_COMMANDS: tuple[Command[Any, Any], ...] = (
    Command(
        name="token.list",
        input=NoInput,
        call=lambda c, i: c.tokens().list(c.principal),
        answer=lambda i, tokens: {"tokens": [token.model_dump(mode="json") for token in tokens]},
        answer_doc='`{"tokens": [{"id", "subject", "role", "scopes", "name", "groups", '
        '"created_at", "expires_at", "last_used_at"}]}`: active tokens within the admin\'s '
        "scopes, never secrets",
        reply=None,
        http=Http("GET", "/v1/tokens", "list_tokens", body=False),
        authorize=require_admin,
        note="administration over HTTP only (also `threadline token list`)",
        limited=False,
    ),
    Command(
        name="token.revoke_id",
        input=RevokeTokenById,
        call=lambda c, i: c.tokens().revoke_id(c.principal, i.token_id),
        answer=lambda i, result: result,
        answer_doc='`{"revoked": true, "subject", "published"}`: the token of that id (from '
        "`GET /v1/tokens`); its websockets close with 4403",
        reply=None,
        http=Http("POST", "/v1/tokens/{token_id}/revoke", "revoke_token_id", body=False),
        authorize=require_admin,
        note="administration over HTTP only (also `threadline token revoke --id`)",
    ),
)
# A live socket follows its token (docs/protocol.md, "Token refresh").
AUTH_COMMANDS: tuple[Command[Any, Any], ...] = (
    Command(
        name="auth.refresh",
        input=RefreshToken,
        call=lambda c, i: c.session().refresh_token(i.token),
        answer=lambda i, fresh: fresh.answer(),
        answer_doc='`{"subject", "expires_in", "expires_at"}` (seconds left, epoch '
        "seconds; both absent: it never expires); the connection closes at the new token's "
        "expiry. A refused token gets its 401 code (`token_expired`, `invalid_signature`, …) or "
        "`token_mismatch`, and changes nothing",
        note="a websocket's own token; HTTP sends a token with every request",
    ),
)
