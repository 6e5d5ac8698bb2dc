"""An approvals service: resolves every pending `send_email` action of its scopes by a rule.

    export THREADLINE_URL=http://127.0.0.1:8000
    export THREADLINE_TOKEN=$(threadline token create --scope demo --role backend --subject bot)
    python examples/approvals_service.py --allow-domain example.com

It subscribes to the scope-wide action inbox (it never watches a thread), so it sees pending
actions of threads it has never heard of, across every gateway. The rule: approve an e-mail to a
recipient whose domain is allowed, refuse any other. Actions of other tools are left alone.
A resolution somebody else made first (`409 conflict`) is reported with the winner and skipped.
With --once it resolves what is pending now and exits (0; 1 on an error).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from pydantic import BaseModel

from threadline_client import (
    ActionConflict,
    NotFound,
    PendingAction,
    ThreadlineClient,
    ThreadlineError,
)

TOOL = "send_email"


class EmailDecision(BaseModel):
    """The send_email action's payload (its schema: `approved` required, `note` optional)."""

    approved: bool
    note: str | None = None


def decide(action: PendingAction, allowed: frozenset[str]) -> EmailDecision:
    recipient = str(action.input.get("to", ""))
    domain = recipient.rpartition("@")[2].lower()
    if domain in allowed:
        return EmailDecision(approved=True, note=f"{domain} is an allowed domain")
    return EmailDecision(approved=False, note=f"{domain or 'no domain'} is not allowed")


class ApprovalsService:
    def __init__(self, client: ThreadlineClient, allowed: frozenset[str]) -> None:
        self.client = client
        self.allowed = allowed
        self.handled: set[str] = set()

    async def handle(self, action: PendingAction) -> None:
        if action.tool_name != TOOL or action.kind != "approval" or action.id in self.handled:
            return
        self.handled.add(action.id)
        decision = decide(action, self.allowed)
        try:
            answer = await self.client.resume(action, decision)
        except ActionConflict as exc:
            print(f"{action.id} already resolved by {exc.resolved_by}", flush=True)
            return
        except NotFound:
            print(f"{action.id} is gone (its run was stopped)", flush=True)
            return
        verdict = "approved" if decision.approved else "refused"
        print(
            f"{verdict} {action.id} in {action.thread_id} (to {action.input.get('to')}):"
            f" version {answer.version}",
            flush=True,
        )

    async def once(self) -> None:
        async for action in self.client.pending():
            await self.handle(action)

    async def forever(self) -> None:
        async with self.client.watch_actions() as inbox:
            async for event in inbox:
                if event.kind == "synced":
                    for action in list(inbox.actions.values()):
                        await self.handle(action)
                elif event.kind == "pending":
                    await self.handle(event.data)
                elif event.kind == "connected":
                    print(f"watching the action inbox of {', '.join(inbox.scopes)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--allow-domain", action="append", default=[], help="a recipient domain to approve"
    )
    parser.add_argument("--once", action="store_true", help="resolve what is pending, then exit")
    args = parser.parse_args(argv)
    token = os.environ.get("THREADLINE_TOKEN")
    if not token:
        parser.error("set THREADLINE_TOKEN to a token of role backend (threadline token create)")
    base_url = os.environ.get("THREADLINE_URL", "http://127.0.0.1:8000")
    allowed = frozenset(domain.lower() for domain in args.allow_domain)

    async def serve() -> None:
        async with ThreadlineClient(base_url, token) as client:
            service = ApprovalsService(client, allowed)
            await (service.once() if args.once else service.forever())

    try:
        asyncio.run(serve())
    except ThreadlineError as exc:
        print(f"error: {exc}", flush=True)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
