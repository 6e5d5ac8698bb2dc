"""Checks on caller input, done before any transaction opens so bad input changes nothing."""

from __future__ import annotations

import math
from typing import Any

from runtime.domain import MAX_METADATA_BYTES, MAX_TEXT_CHARS, MAX_TITLE_CHARS, InputPolicy, Role
from runtime.errors import InvalidInput, TooLarge
from runtime.storage.sql.rows import encode_json

MAX_CLIENT_REQUEST_ID_CHARS = 200


def check_text(text: Any) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("text must be a non-empty string")
    if len(text) > MAX_TEXT_CHARS:
        raise TooLarge(f"text is longer than {MAX_TEXT_CHARS} characters", limit=MAX_TEXT_CHARS)
    return text


MAX_THREAD_ID_CHARS = 200


def check_thread_id(thread_id: Any) -> str:
    """A caller-chosen thread id (AG-UI and AI SDK clients name their threads)."""
    if not isinstance(thread_id, str) or not thread_id.strip():
        raise InvalidInput("thread_id must be a non-empty string")
    if len(thread_id) > MAX_THREAD_ID_CHARS or "\x00" in thread_id:
        raise InvalidInput(
            f"thread_id must be at most {MAX_THREAD_ID_CHARS} characters, without NUL"
        )
    return thread_id


def check_thread_fields(scope: Any, title: Any) -> None:
    if not isinstance(scope, str) or not scope.strip():
        raise InvalidInput("scope must be a non-empty string")
    check_title(title)


def check_title(title: Any) -> None:
    """A thread's title, at creation and at every rename."""
    if not isinstance(title, str):
        raise InvalidInput("title must be a string")
    if len(title) > MAX_TITLE_CHARS:
        raise TooLarge(f"title is longer than {MAX_TITLE_CHARS} characters", limit=MAX_TITLE_CHARS)


def check_submit(submitted_by: Any, client_request_id: Any, policy: Any) -> InputPolicy:
    if not isinstance(submitted_by, str) or not submitted_by:
        raise InvalidInput("submitted_by must be a non-empty string")
    if client_request_id is not None and (
        not isinstance(client_request_id, str)
        or not client_request_id
        or len(client_request_id) > MAX_CLIENT_REQUEST_ID_CHARS
    ):
        raise InvalidInput(f"client_request_id must be 1..{MAX_CLIENT_REQUEST_ID_CHARS} characters")
    try:
        return InputPolicy(policy)
    except ValueError as exc:
        raise InvalidInput(f"unknown input policy {policy!r}") from exc


def check_ttl(ttl: Any) -> float:
    if not isinstance(ttl, int | float) or not math.isfinite(ttl) or ttl <= 0:
        raise InvalidInput("lease ttl must be a positive number of seconds")
    return float(ttl)


def check_owner(owner: Any) -> str:
    if not isinstance(owner, str) or not owner:
        raise InvalidInput("lease owner must be a non-empty string")
    return owner


def check_token(token_hash: Any, subject: Any, role: Any) -> Role:
    if not token_hash or not subject:
        raise InvalidInput("token_hash and subject must be non-empty")
    try:
        return Role(role)
    except ValueError as exc:
        raise InvalidInput(f"unknown role {role!r}") from exc


MAX_DISPLAY_NAME_CHARS = 64


MAX_GROUPS = 50
MAX_GROUP_CHARS = 128


def check_groups(groups: Any) -> list[str]:
    """A token's groups: at most 50 distinct names of 1-128 printable characters, sorted."""
    if groups is None:
        return []
    if isinstance(groups, str) or not all(isinstance(g, str) for g in groups):
        raise InvalidInput("groups must be a list of names")
    names = sorted({g.strip() for g in groups})
    if len(names) > MAX_GROUPS:
        raise InvalidInput(f"a token carries at most {MAX_GROUPS} groups")
    for name in names:
        if not name or len(name) > MAX_GROUP_CHARS or not name.isprintable():
            raise InvalidInput(
                f"a group is 1-{MAX_GROUP_CHARS} printable characters, not {name[:140]!r}"
            )
    return names


def check_display_name(name: Any) -> str | None:
    """A token's display name: None, or 1-64 printable characters (trimmed)."""
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("the display name must be a non-empty string")
    text: str = name.strip()
    if len(text) > MAX_DISPLAY_NAME_CHARS:
        raise InvalidInput(f"the display name is longer than {MAX_DISPLAY_NAME_CHARS} characters")
    if not text.isprintable():
        raise InvalidInput("the display name must not contain control characters")
    return text


def check_patch(patch: Any, what: str) -> dict[str, Any]:
    if patch is None:
        return {}
    if not isinstance(patch, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    encode_json(patch, what, MAX_METADATA_BYTES)
    return patch
