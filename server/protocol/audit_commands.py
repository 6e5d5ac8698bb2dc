"""The command-table rows of the audit log (docs/protocol.md, "Audit log"); `commands` appends
them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field

from runtime.errors import InvalidInput
from runtime.service.audit import AuditPage, audit_for
from runtime.service.thread_service import require_trusted
from server.protocol.command_model import Command, Http
from server.protocol.inputs import ID_MAX, Input

Id = Annotated[str, Field(min_length=1, max_length=ID_MAX)]
_FILTERS = ("thread", "scope", "after", "limit")


class ReadAudit(Input):
    """`GET /v1/audit?thread=…` (or `?scope=…`): a page of the chain after `seq` `after`."""

    thread: Id | None = None
    scope: Id | None = None
    after: int = Field(default=0, ge=0, le=2**62)
    limit: int = Field(default=100, ge=1, le=500)


def _int(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name, str(default))
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise InvalidInput(f"query parameter {name!r} must be an integer from {low} to {high}")
    return int(raw)


def audit_query(query: Mapping[str, str]) -> dict[str, Any]:
    for name in query:
        if name not in _FILTERS:
            raise InvalidInput(f"unknown query parameter {name!r}")
    fields: dict[str, Any] = {
        "after": _int(query, "after", 0, 0, 2**62),
        "limit": _int(query, "limit", 100, 1, 500),
    }
    for name in ("thread", "scope"):
        if query.get(name):
            fields[name] = query[name]
    return fields


def audit_answer(page: AuditPage) -> dict[str, Any]:
    return {
        "scope": page.scope,
        "entries": [entry.model_dump(mode="json") for entry in page.entries],
        "next_cursor": page.next_cursor,
    }


ENTRY = (
    '`{"scope", "seq", "event", "thread_id", "action_id", "subject", "token_id", '
    '"display_name", "transport", "client_address", "user_agent", "at", "detail", '
    '"payload_hash", "prev_hash", "hash"}`'
)


AUDIT_COMMANDS: tuple[Command[Any, Any], ...] = (
    Command(
        name="audit.list",
        input=ReadAudit,
        call=lambda c, i: audit_for(c.service).read(
            c.principal, thread_id=i.thread, scope=i.scope, after=i.after, limit=i.limit
        ),
        answer=lambda i, page: audit_answer(page),
        answer_doc=f'`{{"scope", "entries": [{ENTRY.strip("`")}], "next_cursor"}}`: '
        "`?thread=<id>` or `?scope=<scope>`, `after` (a `seq`: the previous page's "
        "`next_cursor`), `limit`; role `backend` or `admin`",
        reply=None,
        http=Http("GET", "/v1/audit", "list_audit", body=False, query=audit_query),
        authorize=require_trusted,
        note="a read: over HTTP only",
        limited=False,
    ),
)
