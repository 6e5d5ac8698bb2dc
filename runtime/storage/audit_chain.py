"""The audit log's hash chain: an entry's hash, and the check that finds the first broken entry."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import orjson
from pydantic import BaseModel, ConfigDict

# The fields an entry's hash covers, in this order: everything but the hash itself.
HASHED = (
    "scope",
    "seq",
    "event",
    "thread_id",
    "action_id",
    "subject",
    "token_id",
    "display_name",
    "transport",
    "client_address",
    "user_agent",
    "at",
    "detail",
    "payload_hash",
    "prev_hash",
)


class AuditEntry(BaseModel):
    """One appended audit record: who, from where, when, what (a hash of the payload)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: str
    seq: int
    event: str
    thread_id: str
    action_id: str
    subject: str
    token_id: str | None
    display_name: str
    transport: str | None
    client_address: str | None
    user_agent: str | None
    at: float
    detail: str
    payload_hash: str
    prev_hash: str
    hash: str


class ChainReport(BaseModel):
    """What `verify` found: how many entries it checked, and the first broken one if any."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: str
    entries: int
    ok: bool
    broken_seq: int | None = None
    problem: str | None = None


class AuditLog(Protocol):
    """Reads a scope's chain (appended by the store, in the transactions of what it records)."""

    async def audit_entries(
        self, scope: str, *, thread_id: str | None = None, after: int = 0, limit: int = 100
    ) -> list[AuditEntry]:
        """Up to `limit` entries of `scope` (of one thread's, when `thread_id` is set) with a
        `seq` above `after`, in `seq` order."""
        ...


def payload_hash(payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


def entry_hash(fields: Mapping[str, Any]) -> str:
    """sha256 over the canonical JSON of the hashed fields (the float `at` by its repr)."""
    canonical = [repr(fields[n]) if n == "at" else fields[n] for n in HASHED]
    return hashlib.sha256(orjson.dumps(canonical)).hexdigest()


def verify(scope: str, entries: Iterable[AuditEntry]) -> ChainReport:
    """Walk a scope's entries in `seq` order: each must hash to its `hash`, link to the previous
    entry's hash, and follow it by one `seq` (so a deleted entry is found even at the end of
    a gap, and a deleted first entry because the chain must start at seq 1 with '')."""
    prev_hash, expected_seq, count = "", 1, 0
    for entry in entries:
        count += 1
        fields = entry.model_dump()
        if entry.seq != expected_seq:
            return _broken(scope, count, expected_seq, "it is missing (deleted)")
        if entry.prev_hash != prev_hash:
            return _broken(scope, count, entry.seq, "its link to the previous entry is broken")
        if entry_hash(fields) != entry.hash:
            return _broken(scope, count, entry.seq, "its content does not match its hash")
        prev_hash, expected_seq = entry.hash, entry.seq + 1
    return ChainReport(scope=scope, entries=count, ok=True)


def _broken(scope: str, count: int, seq: int, problem: str) -> ChainReport:
    return ChainReport(
        scope=scope, entries=count, ok=False, broken_seq=seq, problem=f"entry {seq}: {problem}"
    )
