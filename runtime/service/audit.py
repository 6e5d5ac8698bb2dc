"""Reading the audit log through the service: trusted roles, the caller's scopes, paged."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from runtime.domain import Principal
from runtime.errors import InvalidInput, NotFound
from runtime.service.companions import Companions
from runtime.service.thread_service import ThreadService, require_trusted
from runtime.storage.audit_chain import AuditEntry, AuditLog, ChainReport, verify


class AuditPage(BaseModel):
    """A page of entries in `seq` order; `next_cursor` (a `seq`) when more may follow."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: str
    entries: tuple[AuditEntry, ...]
    next_cursor: int | None


class AuditService:
    """`GET /v1/audit`: a thread's entries (or a whole scope's) for a backend or admin of the
    scope; a thread or scope outside the caller's scopes is `not_found`, as everywhere."""

    def __init__(self, service: ThreadService, log: AuditLog) -> None:
        self.service = service
        self.log = log

    async def read(
        self,
        principal: Principal,
        *,
        thread_id: str | None,
        scope: str | None,
        after: int,
        limit: int,
    ) -> AuditPage:
        require_trusted(principal)
        if (thread_id is None) == (scope is None):
            raise InvalidInput("name exactly one of 'thread' and 'scope'")
        if thread_id is not None:
            scope = (await self.service.store.get_thread(thread_id, principal.scopes)).scope
        assert scope is not None
        if not principal.can_access(scope):
            raise NotFound(f"scope {scope} not found")
        entries = await self.log.audit_entries(scope, thread_id=thread_id, after=after, limit=limit)
        cursor = entries[-1].seq if len(entries) >= limit and entries else None
        return AuditPage(scope=scope, entries=tuple(entries), next_cursor=cursor)


async def verify_scope(log: AuditLog, scope: str, page: int = 1000) -> ChainReport:
    """Walk `scope`'s whole chain page by page (`audit_chain.verify`)."""
    entries: list[AuditEntry] = []
    after = 0
    while True:
        batch = await log.audit_entries(scope, after=after, limit=page)
        entries += batch
        if len(batch) < page:
            return verify(scope, entries)
        after = batch[-1].seq


_AUDIT: Companions[AuditService] = Companions("the audit log is")
register_audit = _AUDIT.register
audit_for = _AUDIT.of
