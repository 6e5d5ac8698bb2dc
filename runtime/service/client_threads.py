"""Threads named by a client (AG-UI `threadId`, AI SDK chat `id`), each in its caller's scope."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from runtime.domain import Principal, Snapshot
from runtime.errors import Conflict, InvalidInput, NotFound
from runtime.service.thread_service import ThreadService

# The stored id of a client's thread is its client id, a dot and a digest of (scope, client id).
# Client ids cannot hold a dot, so a stored id names exactly one (scope, client id): the same
# client id in two scopes is two threads, and no scope can name, find or claim another's.
DIGEST_CHARS = 24


def client_thread_id(scope: str, client_id: str) -> str:
    """The Threadline thread id of the client id `client_id` in `scope` (docs/protocol.md)."""
    digest = hashlib.sha256(f"{scope}\x00{client_id}".encode()).hexdigest()[:DIGEST_CHARS]
    return f"{client_id}.{digest}"


async def find_client_thread(
    service: ThreadService, principal: Principal, client_id: str
) -> Snapshot | None:
    """The caller's thread `client_id` names, or None: a Threadline id of a thread in its scopes
    (a thread created over HTTP), else the client id's own thread in one of its scopes. Only the
    caller's scopes are read, so a foreign id looks exactly like a free one."""
    candidates = [client_id, *(client_thread_id(s, client_id) for s in sorted(principal.scopes))]
    for thread_id in candidates:
        try:
            return await service.snapshot(principal, thread_id)
        except NotFound:
            continue
    return None


@dataclass(frozen=True)
class ClientThread:
    """The thread a client id names: its Threadline id, and its state (None: not created yet)."""

    thread_id: str
    snapshot: Snapshot | None


async def open_client_thread(
    service: ThreadService, principal: Principal, client_id: str, *, create: bool
) -> ClientThread:
    """The caller's thread `client_id` names, created in its scope on first use when `create`.

    A token with several scopes names no scope to create in: `invalid_input` unless one of its
    scopes has the thread already.
    """
    found = await find_client_thread(service, principal, client_id)
    if found is not None:
        return ClientThread(found.thread.id, found)
    if len(principal.scopes) != 1:
        raise InvalidInput(
            "this token has several scopes: create the thread with POST /v1/threads and 'scope'"
        )
    scope = next(iter(principal.scopes))
    thread_id = client_thread_id(scope, client_id)
    if not create:
        return ClientThread(thread_id, None)
    try:
        created = await service.store.create_thread(
            scope, thread_id=thread_id, owner=principal.subject
        )
    except Conflict:
        # A concurrent request of the same scope created it first: the id is derived from the
        # scope, so nobody else can have.
        return ClientThread(thread_id, await service.snapshot(principal, thread_id))
    await service.publisher.invalidate(thread_id, created.version)
    return ClientThread(thread_id, await service.snapshot(principal, thread_id))
