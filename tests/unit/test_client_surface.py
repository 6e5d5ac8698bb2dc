"""The Python client's surfaces: every documented error code typed, sync and async alike."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from threadline_client import SyncThreadlineClient, ThreadlineClient, exceptions, sync

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
# Calls only the blocking client has: its own lifetime, and two conveniences over `watch`.
SYNC_ONLY = {"close", "wait", "events"}


def documented_codes() -> set[str]:
    """The codes of the error table in docs/protocol.md (rows `| \\`code\\` | status |`)."""
    text = PROTOCOL.read_text(encoding="utf-8")
    return set(re.findall(r"^\| `([a-z_]+)` \| \d{3} \|", text, re.M))


def test_every_documented_error_code_has_its_typed_exception() -> None:
    codes = documented_codes()
    assert len(codes) > 20
    assert codes == set(exceptions._BY_CODE)
    for code in codes:
        error = exceptions.error_from(code, "m", 400, {})
        # A caller can always tell a code apart from the base class.
        assert type(error) is not exceptions.ThreadlineError, code


def test_run_stopping_and_illegal_transition_are_typed_conflicts() -> None:
    stopping = exceptions.error_from("run_stopping", "m", 409, {})
    illegal = exceptions.error_from("illegal_transition", "m", 409, {})
    assert isinstance(stopping, exceptions.RunStopping)
    assert isinstance(illegal, exceptions.IllegalTransition)
    assert isinstance(stopping, exceptions.Conflict) and isinstance(illegal, exceptions.Conflict)


def public(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")} - {
        name for name, value in vars(cls).items() if isinstance(value, property)
    }


def test_the_sync_client_has_every_call_of_the_async_one() -> None:
    async_calls = {n for n in public(ThreadlineClient) if callable(getattr(ThreadlineClient, n))}
    # The blocking calls are descriptors made from the async methods (`sync._Blocking`).
    made = (sync._Blocking, sync._Iterating)
    sync_calls = {
        n
        for n in public(SyncThreadlineClient)
        if callable(getattr(SyncThreadlineClient, n))
        or isinstance(getattr(SyncThreadlineClient, n), made)
    }
    assert {"watch", "watch_actions", "threads", "update_metadata"} <= async_calls
    assert async_calls == sync_calls - SYNC_ONLY
