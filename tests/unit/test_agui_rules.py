"""Rules of the UI protocols: what an AG-UI client may put in `state`, and the denial rule."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from runtime.errors import InvalidInput
from runtime.tools import denied_unless_approved
from server.transports.sse.agui_info import capabilities
from server.transports.sse.agui_input import check_state, parse_input


def body(**extra: Any) -> bytes:
    return orjson.dumps({"threadId": "t", "runId": "r", "messages": [], **extra})


@pytest.mark.parametrize("state", [None, {}, {"run": None, "pendingActions": []}])
def test_the_server_keys_may_come_back(state: Any) -> None:
    check_state(state)
    parse_input(body(state=state))


@pytest.mark.parametrize("state", [{"theme": "dark"}, {"run": None, "x": 1}, [1], "s"])
def test_anything_else_is_refused(state: Any) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_input(body(state=state))
    assert "read-only" in refused.value.message


def test_capabilities_name_the_server_keys() -> None:
    custom = capabilities()["custom"]["threadline"]
    assert custom["clientState"]["serverKeys"] == ["pendingActions", "run"]


class Approval(BaseModel):
    approved: bool
    note: str | None = None


def test_denied_unless_approved() -> None:
    assert denied_unless_approved(Approval(approved=True, note="x")) is None
    assert denied_unless_approved(Approval(approved=False)) == "denied"
    assert denied_unless_approved(Approval(approved=False, note="no")) == "denied: no"
