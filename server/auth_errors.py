"""Why a bearer token was refused: one code each, every one answered 401 (close code 4401)."""

from __future__ import annotations

from runtime.errors import ThreadlineError


class Unauthorized(ThreadlineError):
    """A missing, malformed or unknown bearer token."""

    code = "unauthorized"


class InvalidToken(Unauthorized):
    """A JWT that does not parse, or whose mapped claims are missing or malformed."""

    code = "invalid_token"


class TokenExpired(Unauthorized):
    code = "token_expired"


class TokenNotYetValid(Unauthorized):
    code = "token_not_yet_valid"


class InvalidAudience(Unauthorized):
    code = "invalid_audience"


class InvalidIssuer(Unauthorized):
    """An issuer that is not configured (or a token whose `iss` does not match)."""

    code = "invalid_issuer"


class InvalidSignature(Unauthorized):
    """A signature that does not verify, or made by a key the issuer does not publish."""

    code = "invalid_signature"


class UnsupportedAlgorithm(Unauthorized):
    """An algorithm outside the issuer's allow-list (always: `none` and HS*)."""

    code = "unsupported_algorithm"


class TokenMismatch(Unauthorized):
    """An `auth.refresh` token that names someone else than the connection's: another subject,
    role, issuer or set of scopes (docs/protocol.md, "Token refresh")."""

    code = "token_mismatch"


# Every code above, for the status table (wire_errors.STATUS) and the docs.
CODES = tuple(
    cls.code
    for cls in (
        Unauthorized,
        InvalidToken,
        TokenExpired,
        TokenNotYetValid,
        InvalidAudience,
        InvalidIssuer,
        InvalidSignature,
        UnsupportedAlgorithm,
        TokenMismatch,
    )
)
