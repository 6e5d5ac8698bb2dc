"""Backend actor example: list a thread's pending actions and resume one, with threadline_client.

    export THREADLINE_URL=http://127.0.0.1:8000
    export THREADLINE_TOKEN=$(threadline token create --scope demo --role backend --subject billing)
    python examples/backend_resume.py THREAD_ID --list
    python examples/backend_resume.py THREAD_ID --approve --note "checked by billing"
    python examples/backend_resume.py THREAD_ID --action ACTION_ID --payload '{"approved": false}'

Without --action it resolves the thread's first pending action. The payload is the typed
`Approval` model below (what the demo's send_email and the weather example's subscribe_alerts
expect), or any JSON object given with --payload for other schemas. After resuming it watches
the thread (--wait seconds) until the run settles, and prints its outcome.

Exit status: 0 resumed (or listed), 1 request failed, 2 no pending action, 3 conflict (the
action was already resolved: the message names who won), 4 invalid payload (field errors).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from threadline_client import (
    ActionConflict,
    InvalidPayload,
    PendingAction,
    Snapshot,
    ThreadlineClient,
    ThreadlineError,
)

SETTLED = ("waiting", "completed", "failed", "cancelled")
EXIT_FAILED, EXIT_NO_ACTION, EXIT_CONFLICT, EXIT_INVALID = 1, 2, 3, 4


class Approval(BaseModel):
    """The resume payload of an approval action: `approved` is required, `note` optional."""

    model_config = ConfigDict(extra="forbid")
    approved: bool
    note: str | None = Field(default=None, max_length=2_000)


def describe(action: PendingAction) -> str:
    schema = action.payload_schema
    fields = ", ".join(
        f"{name}{'*' if name in schema.get('required', []) else ''}"
        for name in schema.get("properties", {})
    )
    return (
        f"{action.id}  {action.kind}  {action.tool_name}"
        f"({json.dumps(action.input, ensure_ascii=False)})  payload: {{{fields}}}"
        f"  roles: {','.join(action.allowed_roles)}"
    )


def payload_from(args: argparse.Namespace) -> BaseModel | dict[str, Any]:
    if args.payload is not None:
        payload = json.loads(args.payload)
        if not isinstance(payload, dict):
            raise ValueError("--payload must be a JSON object")
        return payload
    return Approval(approved=not args.refuse, note=args.note)


def settled(snapshot: Snapshot | None) -> bool:
    return snapshot is not None and (snapshot.run is None or snapshot.run.status in SETTLED)


async def run(args: argparse.Namespace, client: ThreadlineClient) -> int:
    thread_id = args.thread_id
    try:
        snapshot = await client.snapshot(thread_id)
    except ThreadlineError as exc:
        print(f"cannot read thread {thread_id}: {exc.code}: {exc.message}")
        return EXIT_FAILED
    actions = snapshot.pending_actions
    print(f"thread {thread_id} at version {snapshot.version}: {len(actions)} pending action(s)")
    for action in actions:
        print(f"  {describe(action)}")
    if args.list:
        return 0

    action_id = args.action or (actions[0].id if actions else None)
    if action_id is None:
        print("nothing to resume")
        return EXIT_NO_ACTION
    payload = payload_from(args)
    try:
        answer = await client.resume(action_id, payload, thread_id=thread_id)
    except ActionConflict as exc:
        print(f"conflict: {exc.message}")
        print(f"  resolved_by: {exc.resolved_by}")
        return EXIT_CONFLICT
    except InvalidPayload as exc:
        print(f"{exc.code}: {exc.message}")
        for problem in exc.errors:
            print(f"  {'.'.join(map(str, problem['loc'])) or '(payload)'}: {problem['msg']}")
        return EXIT_INVALID
    except ThreadlineError as exc:
        print(f"resume failed ({exc.status}) {exc.code}: {exc.message}")
        return EXIT_FAILED
    sent = payload.model_dump(exclude_none=True) if isinstance(payload, BaseModel) else payload
    print(f"resumed {action_id} with {json.dumps(sent)}: version {answer.version}")

    if args.wait > 0:
        # The watch converges like a browser tab: it refetches on each newer invalidation.
        async with client.watch(thread_id) as watch:
            try:
                await watch.until(
                    lambda w: (
                        w.settled
                        and w.snapshot is not None
                        and w.snapshot.version >= answer.version
                        and settled(w.snapshot)
                    ),
                    args.wait,
                )
            except TimeoutError:
                print(f"the run did not settle within {args.wait}s")
            outcome: Snapshot | None = watch.snapshot
        if outcome is not None and outcome.run is not None:
            text = next((m.text for m in reversed(outcome.messages) if m.role == "assistant"), "")
            print(f"run {outcome.run.id} {outcome.run.status}: {text}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("thread_id")
    parser.add_argument("--action", help="the action id (default: the first pending action)")
    parser.add_argument("--list", action="store_true", help="only list the pending actions")
    decision = parser.add_mutually_exclusive_group()
    decision.add_argument("--approve", action="store_true", help="approved: true (default)")
    decision.add_argument("--refuse", action="store_true", help="approved: false")
    decision.add_argument("--payload", help="any JSON object, for other payload schemas")
    parser.add_argument("--note", help="optional note of the Approval payload")
    parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the run")
    args = parser.parse_args(argv)

    token = os.environ.get("THREADLINE_TOKEN")
    if not token:
        parser.error("set THREADLINE_TOKEN to a token of role backend (threadline token create)")
    base_url = os.environ.get("THREADLINE_URL", "http://127.0.0.1:8000")

    async def session() -> int:
        async with ThreadlineClient(base_url, token) as client:
            return await run(args, client)

    try:
        return asyncio.run(session())
    except (httpx.HTTPError, ValueError) as exc:
        print(f"error: {exc}")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
