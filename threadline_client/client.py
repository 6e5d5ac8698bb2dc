"""The async Threadline client: threads, messages, runs and actions over HTTP; watches over ws."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

import httpx
from pydantic import BaseModel

from threadline_client.base import AsyncClosing
from threadline_client.exceptions import ConnectionFailed, error_of_response
from threadline_client.hooks import HooksCalls
from threadline_client.models import (
    Admission,
    Message,
    MetadataAnswer,
    PendingAction,
    Principal,
    RegenerateAnswer,
    Snapshot,
    StopAnswer,
    ThreadInfo,
    ThreadPage,
    VersionAnswer,
)
from threadline_client.tokens import REFRESH_MARGIN, TokenProvider, TokenSource
from threadline_client.watch import ActionsWatch, Backoff, ThreadWatch
from threadline_wire.message_parts import ListedAction

Policy = Literal["enqueue", "reject", "interrupt"]
# Requests retried after a transport failure (or a 503): idempotent methods, and bodies with a
# client_request_id (a send), which the server deduplicates: a retry never acts twice.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
ATTEMPTS = 3


def _ws_url(base_url: str) -> str:
    if base_url.startswith("https://"):
        return "wss://" + base_url[len("https://") :] + "/v1/ws"
    if base_url.startswith("http://"):
        return "ws://" + base_url[len("http://") :] + "/v1/ws"
    raise ValueError(f"base_url must be http(s)://…, not {base_url!r}")


def payload_dict(payload: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    """A resume payload as JSON-ready data: a pydantic model (its JSON dump, unset None left out)
    or a mapping as is."""
    if isinstance(payload, BaseModel):
        dumped: dict[str, Any] = payload.model_dump(mode="json", exclude_none=True)
        return dumped
    return dict(payload)


class ThreadlineClient(HooksCalls, AsyncClosing):
    """An async client bound to one server and one bearer token.

    ```
    async with ThreadlineClient("http://127.0.0.1:8000", token) as tl:
        thread = await tl.create_thread(title="hello")
        await tl.send(thread.thread.id, "hi")
        async with tl.watch(thread.thread.id) as watch:
            state = await watch.until(lambda s: s.snapshot.run.status == "completed")
    ```
    Error answers raise typed errors (`threadline_client.exceptions`).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        token_provider: TokenProvider | None = None,
        refresh_margin: float = REFRESH_MARGIN,
        timeout: float = 10.0,
        ws_url: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        attempts: int = ATTEMPTS,
    ) -> None:
        """`token`: a fixed bearer token; or `token_provider`, a callable (sync or async) that
        returns one, called for the first token (when `token` is None) and again before each
        expires: a JWT's `exp` read from it, a `tl_` token's from the server. Watches send
        the next one on their open socket (`auth.refresh`), so they stay open past an expiry."""
        self.attempts = max(1, attempts)
        self.base_url = base_url.rstrip("/")
        self.tokens = TokenSource(token, token_provider, margin=refresh_margin)
        self.ws_url = ws_url or _ws_url(self.base_url)
        self.http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"} if token else {},
            timeout=timeout,
            transport=transport,
        )

    @property
    def token(self) -> str:
        """The bearer token in use (the provider's latest, with one)."""
        return self.tokens.current

    async def bearer(self, *, fresh: bool = False) -> str:
        """A token to send now (`fresh`: the provider's next one), set on the HTTP client."""
        token = await (self.tokens.fresh() if fresh else self.tokens.get())
        self.http.headers["Authorization"] = f"Bearer {token}"
        return token

    async def aclose(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request; the decoded body of a 2xx answer, a typed error otherwise.

        Retried with backoff when that is safe: an idempotent method, or a body carrying a
        `client_request_id` (the server deduplicates it), after a transport failure or a 503.
        A server never reached raises `ConnectionFailed`, never httpx's own error."""
        body = kwargs.get("json")
        safe = method in IDEMPOTENT or (isinstance(body, dict) and "client_request_id" in body)
        attempts = self.attempts if safe else 1
        backoff = Backoff(initial=0.2, maximum=2.0)
        renewed = not self.tokens.refreshable
        for attempt in range(1, attempts + 1):
            last = attempt == attempts
            await self.bearer()
            try:
                response = await self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if last:
                    raise ConnectionFailed("connection_failed", str(exc) or repr(exc)) from exc
            else:
                if response.is_success:
                    return response.json() if response.content else None
                if response.status_code == 401 and not renewed:
                    # An expired token (a `tl_` one's expiry is the server's to know): the
                    # provider's next, once; a request refused for it had no effect.
                    renewed = True
                    await self.bearer(fresh=True)
                    response = await self.http.request(method, path, **kwargs)
                    if response.is_success:
                        return response.json() if response.content else None
                if response.status_code != 503 or last:
                    raise error_of_response(response)
            await asyncio.sleep(backoff.next())
        raise AssertionError("unreachable")

    # --- threads ---------------------------------------------------------------------------

    async def me(self) -> Principal:
        return Principal.model_validate(await self.request("GET", "/v1/me"))

    async def create_thread(
        self,
        title: str | None = None,
        *,
        metadata: dict[str, Any] | None = None,
        scope: str | None = None,
    ) -> Snapshot:
        body: dict[str, Any] = {}
        if title is not None:
            body["title"] = title
        if metadata is not None:
            body["metadata"] = metadata
        if scope is not None:
            body["scope"] = scope
        return Snapshot.model_validate(await self.request("POST", "/v1/threads", json=body))

    async def list_threads(
        self,
        limit: int = 100,
        *,
        metadata: Mapping[str, str] | None = None,
        status: Literal["idle", "running", "waiting"] | None = None,
        updated_after: float | None = None,
        updated_before: float | None = None,
        cursor: str | None = None,
    ) -> ThreadPage:
        """One page of the token's threads, newest update first (`GET /v1/threads`), filtered
        by metadata values, status and update time; `page.next_cursor` (None on the last page)
        is the `cursor` of the next. `threads()` follows every page."""
        params: dict[str, Any] = {"limit": limit}
        params.update({f"metadata.{k}": v for k, v in (metadata or {}).items()})
        extra: dict[str, Any] = {"status": status, "updated_after": updated_after}
        extra.update({"updated_before": updated_before, "cursor": cursor})
        params.update({k: v for k, v in extra.items() if v is not None})
        return ThreadPage.model_validate(await self.request("GET", "/v1/threads", params=params))

    async def threads(
        self,
        *,
        page_size: int = 100,
        metadata: Mapping[str, str] | None = None,
        status: Literal["idle", "running", "waiting"] | None = None,
    ) -> AsyncIterator[ThreadInfo]:
        """Every thread `list_threads` finds, page after page by its cursor."""
        cursor: str | None = None
        while True:
            page = await self.list_threads(
                page_size, metadata=metadata, status=status, cursor=cursor
            )
            for thread in page.threads:
                yield thread
            cursor = page.next_cursor
            if cursor is None:
                return

    async def update_metadata(self, thread_id: str, patch: Mapping[str, Any]) -> MetadataAnswer:
        """Merge `patch` into the thread's metadata (RFC 7396: None removes a key)."""
        path = f"/v1/threads/{thread_id}/metadata"
        answer = await self.request("PATCH", path, json={"metadata": dict(patch)})
        return MetadataAnswer.model_validate(answer)

    async def snapshot(
        self,
        thread_id: str,
        *,
        include_hidden: bool = False,
        before: int | None = None,
        limit: int | None = None,
    ) -> Snapshot:
        """The thread's committed state; its messages are the last page (`limit`, default the
        server's 100) before the cursor `before` (default: the newest). `snapshot.page.before`
        is the cursor of the next older page, None when there is none."""
        params: dict[str, Any] = {}
        if include_hidden:
            params["include_hidden"] = "true"
        if before is not None:
            params["before"] = before
        if limit is not None:
            params["limit"] = limit
        body = await self.request("GET", f"/v1/threads/{thread_id}", params=params or None)
        return Snapshot.model_validate(body)

    async def snapshot_with_wire(self, thread_id: str) -> tuple[Snapshot, dict[str, Any]]:
        """The thread's default snapshot, and its body as the server wrote it: the base a
        snapshot delta applies to (the model fills in what the wire leaves out)."""
        body = await self.request("GET", f"/v1/threads/{thread_id}")
        return Snapshot.model_validate(body), body

    async def pages(
        self, thread_id: str, *, page_size: int | None = None, include_hidden: bool = False
    ) -> AsyncIterator[Snapshot]:
        """The thread's snapshot pages, newest first, until the oldest message."""
        before: int | None = None
        while True:
            page = await self.snapshot(
                thread_id, include_hidden=include_hidden, before=before, limit=page_size
            )
            yield page
            before = page.page.before if page.page is not None else None
            if before is None:
                return

    async def history(
        self, thread_id: str, *, page_size: int | None = None, include_hidden: bool = False
    ) -> list[Message]:
        """Every message of the thread, oldest first (all pages read, newest page first)."""
        pages = [
            page.messages
            async for page in self.pages(
                thread_id, page_size=page_size, include_hidden=include_hidden
            )
        ]
        return [message for messages in reversed(pages) for message in messages]

    async def send(
        self,
        thread_id: str,
        text: str,
        *,
        client_request_id: str | None = None,
        policy: Policy | None = None,
    ) -> Admission:
        """Send a message. `client_request_id` (a fresh one when not given) makes the send
        idempotent: transport failures are retried with it, and repeating it later answers
        the first request's message and run with `duplicate=True`."""
        body: dict[str, Any] = {
            "text": text,
            "client_request_id": client_request_id or f"py-{uuid.uuid4().hex}",
        }
        if policy is not None:
            body["policy"] = policy
        path = f"/v1/threads/{thread_id}/messages"
        return Admission.model_validate(await self.request("POST", path, json=body))

    async def stop(self, thread_id: str, run_id: str) -> StopAnswer:
        body = await self.request("POST", f"/v1/threads/{thread_id}/runs/{run_id}/stop")
        return StopAnswer.model_validate(body)

    async def regenerate(self, thread_id: str, message_id: str | None = None) -> RegenerateAnswer:
        body = {"message_id": message_id} if message_id is not None else {}
        answer = await self.request("POST", f"/v1/threads/{thread_id}/regenerate", json=body)
        return RegenerateAnswer.model_validate(answer)

    async def retry(
        self, thread_id: str, run_id: str | None = None, *, expected_version: int | None = None
    ) -> RegenerateAnswer:
        """Start the input of the thread's latest run again, when that run failed or was
        cancelled (its messages go; the answer names the new run). `run_id`, when given, must
        be that latest run; otherwise it is read from the snapshot. `Conflict` otherwise."""
        if run_id is None:
            run = (await self.snapshot(thread_id, limit=1)).run
            if run is None:
                raise ValueError(f"thread {thread_id} has no run to retry")
            run_id = run.id
        body = {"expected_version": expected_version} if expected_version is not None else {}
        path = f"/v1/threads/{thread_id}/runs/{run_id}/retry"
        return RegenerateAnswer.model_validate(await self.request("POST", path, json=body))

    def watch(
        self, thread_id: str, *, backoff: Backoff | None = None, deltas: bool = True
    ) -> ThreadWatch:
        """A live view of one thread (see `ThreadWatch`; `deltas=False`: refetch after every
        invalidation instead of applying its snapshot delta); use with `async with`."""
        return ThreadWatch(self, thread_id, backoff=backoff, deltas=deltas)

    # --- actions ---------------------------------------------------------------------------

    async def pending(
        self, *, page_size: int = 100, assigned: Literal["me"] | None = None
    ) -> AsyncIterator[PendingAction]:
        """Every pending action the token's scopes can see, across threads, oldest first
        (`GET /v1/actions?status=pending`, followed page by page); `assigned="me"`: only those
        this caller may decide now."""
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"status": "pending", "limit": page_size}
            if assigned is not None:
                params["assigned"] = assigned
            if cursor is not None:
                params["cursor"] = cursor
            body = await self.request("GET", "/v1/actions", params=params)
            for item in body["actions"]:
                yield PendingAction.model_validate(item)
            cursor = body.get("next_cursor")
            if not cursor:
                return

    def watch_actions(
        self, *, backoff: Backoff | None = None, assigned: Literal["me"] | None = None
    ) -> ActionsWatch:
        """A live view of the scope-wide inbox (see `ActionsWatch`; `assigned="me"`: only what
        this caller may decide now); use with `async with`."""
        return ActionsWatch(self, backoff=backoff, assigned=assigned)

    async def resume(
        self,
        action: PendingAction | str,
        payload: BaseModel | Mapping[str, Any],
        *,
        thread_id: str | None = None,
        expected_version: int | None = None,
    ) -> VersionAnswer:
        """Resolve an approval action with a payload (a pydantic model or a mapping).

        Raises `ActionConflict` (`resolved_by` names the winner) when it was already resolved,
        `InvalidPayload` (`errors`) when the payload does not match the action's schema,
        `Forbidden` for a role the action does not allow, `NotFound`, `RateLimited`.
        """
        action_id, thread_id = self._action_ref(action, thread_id)
        body: dict[str, Any] = {"payload": payload_dict(payload)}
        if expected_version is not None:
            body["expected_version"] = expected_version
        path = f"/v1/threads/{thread_id}/actions/{action_id}/resume"
        return VersionAnswer.model_validate(await self.request("POST", path, json=body))

    async def reassign(
        self,
        action: PendingAction | str,
        *,
        to_subject: str | None = None,
        to_group: str | None = None,
        thread_id: str | None = None,
    ) -> VersionAnswer:
        """Hand an approval you may decide to one subject or one group (its policy must permit
        delegation): they are its deciders until the stage ends. Raises `Forbidden`
        (`delegation_not_allowed`, `not_a_decider`, `requester_excluded`), `ActionConflict`
        when it is no longer pending, `NotFound`."""
        action_id, thread_id = self._action_ref(action, thread_id)
        body = {k: v for k, v in {"to_subject": to_subject, "to_group": to_group}.items() if v}
        path = f"/v1/threads/{thread_id}/actions/{action_id}/reassign"
        return VersionAnswer.model_validate(await self.request("POST", path, json=body))

    async def submit_result(
        self,
        action: PendingAction | str,
        *,
        output: Any = None,
        error: str | None = None,
        thread_id: str | None = None,
        manual: bool = False,
    ) -> VersionAnswer:
        """The result of a client-tool action (or, `manual=True`, a manual-result action)."""
        action_id, thread_id = self._action_ref(action, thread_id)
        kind = "manual-result" if manual else "client-result"
        body = {"output": output, "error": error}
        path = f"/v1/threads/{thread_id}/actions/{action_id}/{kind}"
        return VersionAnswer.model_validate(await self.request("POST", path, json=body))

    @staticmethod
    def _action_ref(action: ListedAction | str, thread_id: str | None) -> tuple[str, str]:
        # Any listed action: a snapshot's, the inbox's or an `action.pending` frame's.
        if isinstance(action, ListedAction):
            thread_id = thread_id or action.thread_id
            action_id = action.id
        else:
            action_id = action
        if not thread_id:
            raise ValueError("thread_id is needed for an action given by id only")
        return action_id, thread_id
