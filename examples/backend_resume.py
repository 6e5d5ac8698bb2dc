"""Backend actor example: list a thread's pending actions over HTTP and resume one with a payload.

    export THREADLINE_URL=http://127.0.0.1:8000
    export THREADLINE_TOKEN=$(threadline token create --scope demo --role backend --subject billing)
    python examples/backend_resume.py THREAD_ID --list
    python examples/backend_resume.py THREAD_ID --approve --note "checked by billing"
    python examples/backend_resume.py THREAD_ID --action ACTION_ID --payload '{"approved": false}'

Without --action it resolves the thread's first pending action. The payload is the typed
`Approval` model below (what the demo's send_email and the weather example's subscribe_alerts
expect), or any JSON object given with --payload for other schemas. After resuming it waits
(--wait seconds) for the run to settle and prints its outcome.

Exit status: 0 resumed (or listed), 1 request failed, 2 no pending action, 3 conflict (the
action was already resolved: the message names who won), 4 invalid payload (field errors).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

SETTLED = ("waiting", "completed", "failed", "cancelled")
EXIT_FAILED, EXIT_NO_ACTION, EXIT_CONFLICT, EXIT_INVALID = 1, 2, 3, 4


class Approval(BaseModel):
    """The resume payload of an approval action: `approved` is required, `note` optional."""

    model_config = ConfigDict(extra="forbid")
    approved: bool
    note: str | None = Field(default=None, max_length=2_000)


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The `error` object of a Threadline error body (every error has this shape)."""
    try:
        body = response.json()
    except ValueError:
        return {"code": "http_error", "message": response.text[:200]}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {"code": "http_error", "message": str(body)}


def describe(action: dict[str, Any]) -> str:
    schema = action.get("schema", {})
    fields = ", ".join(
        f"{name}{'*' if name in schema.get('required', []) else ''}"
        for name in schema.get("properties", {})
    )
    return (
        f"{action['id']}  {action['kind']}  {action['tool_name']}"
        f"({json.dumps(action['input'], ensure_ascii=False)})  payload: {{{fields}}}"
        f"  roles: {','.join(action['allowed_roles'])}"
    )


def assistant_text(snapshot: dict[str, Any]) -> str:
    for message in reversed(snapshot["messages"]):
        if message["role"] == "assistant":
            return "".join(p["text"] for p in message["parts"] if p["type"] == "text")
    return ""


def wait_for_outcome(client: httpx.Client, thread_id: str, timeout: float) -> dict[str, Any]:
    """Poll the snapshot until the run waits again or ends (a websocket client would instead
    refetch on each `invalidate` frame)."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(f"/v1/threads/{thread_id}")
        response.raise_for_status()
        snapshot: dict[str, Any] = response.json()
        run = snapshot["run"]
        if run is None or run["status"] in SETTLED or time.monotonic() > deadline:
            return snapshot
        time.sleep(0.2)


def payload_from(args: argparse.Namespace) -> dict[str, Any]:
    if args.payload is not None:
        payload = json.loads(args.payload)
        if not isinstance(payload, dict):
            raise ValueError("--payload must be a JSON object")
        return payload
    return Approval(approved=not args.refuse, note=args.note).model_dump(exclude_none=True)


def run(args: argparse.Namespace, client: httpx.Client) -> int:
    thread_id = args.thread_id
    response = client.get(f"/v1/threads/{thread_id}")
    if response.status_code != 200:
        error = error_of(response)
        print(f"cannot read thread {thread_id}: {error['code']}: {error['message']}")
        return EXIT_FAILED
    snapshot = response.json()
    actions: list[dict[str, Any]] = snapshot["pending_actions"]
    print(f"thread {thread_id} at version {snapshot['thread']['version']}:"
          f" {len(actions)} pending action(s)")
    for action in actions:
        print(f"  {describe(action)}")
    if args.list:
        return 0

    action_id = args.action or (actions[0]["id"] if actions else None)
    if action_id is None:
        print("nothing to resume")
        return EXIT_NO_ACTION
    payload = payload_from(args)
    response = client.post(
        f"/v1/threads/{thread_id}/actions/{action_id}/resume", json={"payload": payload}
    )
    if response.status_code == 409:
        error = error_of(response)
        print(f"conflict: {error['message']}")
        if error.get("resolved_by"):
            print(f"  resolved_by: {error['resolved_by']}")
        return EXIT_CONFLICT
    if response.status_code == 422:
        error = error_of(response)
        print(f"{error['code']}: {error['message']}")
        for problem in error.get("errors", []):
            print(f"  {'.'.join(problem['loc']) or '(payload)'}: {problem['msg']}")
        return EXIT_INVALID
    if response.status_code != 200:
        error = error_of(response)
        print(f"resume failed ({response.status_code}) {error['code']}: {error['message']}")
        return EXIT_FAILED
    print(f"resumed {action_id} with {json.dumps(payload)}: version {response.json()['version']}")

    if args.wait > 0:
        outcome = wait_for_outcome(client, thread_id, args.wait)
        run_view = outcome["run"] or {}
        print(f"run {run_view.get('id')} {run_view.get('status')}: {assistant_text(outcome)}")
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
    base_url = os.environ.get("THREADLINE_URL", "http://127.0.0.1:8000").rstrip("/")
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=base_url, headers=headers, timeout=10.0) as client:
            return run(args, client)
    except (httpx.HTTPError, ValueError) as exc:
        print(f"error: {exc}")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
