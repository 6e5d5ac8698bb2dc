"""Tools from MCP servers nobody here wrote (mcp-server-time over stdio) and from the tests' own
server (Streamable HTTP): offered with their schemas, approval from annotations, progress live
to every watcher, stop as MCP cancellation, a crashing server restarted, list_changed."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.agent import Agent
from runtime.domain import RunStatus, Snapshot, ToolCallPart, ToolState
from runtime.lifecycle import AgentLifecycle, ToolCall, ToolCallContext, ToolResult
from runtime.mcp import MCPHttp, MCPStdio
from runtime.providers.model_api import ModelRequest
from runtime.providers.scripted import (
    ScriptedModel,
    ScriptedToolCall,
    text_response,
    tool_call_response,
    tool_calls_response,
)
from tests.conformance.runtime_harness import ALICE, BOB, Recorder, settled
from tests.mcp_servers import SERVER, HttpTestServer, http_test_server

TIME = MCPStdio(
    name="time",
    command=sys.executable,
    args=["-m", "mcp_server_time", "--local-timezone", "UTC"],
    connect_timeout=60,
)
RUN_TIMEOUT = 60.0


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpTestServer]:
    with http_test_server(tmp_path) as server:
        yield server


def http_tools_of(server: HttpTestServer, **options: Any) -> MCPHttp:
    return MCPHttp(name="tests", url=server.url, connect_timeout=60, **options)


def tool_parts(snapshot: Snapshot) -> list[ToolCallPart]:
    return [p for m in snapshot.messages for p in m.parts if isinstance(p, ToolCallPart)]


async def eventually(check: Callable[[], bool], timeout: float = RUN_TIMEOUT) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)


def offered(request: ModelRequest) -> dict[str, dict[str, Any]]:
    return {spec.name: dict(spec.parameters) for spec in request.tools}


async def test_the_reference_time_server_over_stdio(runtime_for: Any) -> None:
    model = ScriptedModel(
        [
            tool_call_response("time__get_current_time", {"timezone": "Europe/Paris"}, id="c1"),
            tool_call_response("time__get_current_time", {"timezone": "Nowhere/Atlantis"}, id="c2"),
            text_response("It is late in Paris."),
        ]
    )
    rt = await runtime_for(Agent(model=model, mcp_servers=[TIME]))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "what time is it in Paris?")
    snapshot = await rt.wait_for(thread_id, settled, RUN_TIMEOUT)
    assert snapshot.run is not None and snapshot.run.status is RunStatus.COMPLETED
    schema = offered(model.calls[0])["time__get_current_time"]
    assert schema["required"] == ["timezone"]
    assert "time__convert_time" in offered(model.calls[0])
    paris, nowhere = tool_parts(snapshot)
    # read-only: no approval; structured content is the output.
    assert paris.state is ToolState.OUTPUT_AVAILABLE, paris
    assert paris.output["timezone"] == "Europe/Paris"
    # isError reaches the model as an error, with the server's message.
    assert nowhere.state is ToolState.OUTPUT_ERROR
    assert nowhere.error is not None and "Invalid timezone" in nowhere.error
    model.assert_consumed()


class Hooks(AgentLifecycle):
    """Narrows the offered tools and records the tool hooks, as for any tool."""

    def __init__(self) -> None:
        self.before: list[str] = []
        self.after: list[tuple[str, ToolState]] = []

    async def prepare_model_step(self, ctx: Any, request: ModelRequest) -> ModelRequest:
        return request.model_copy(
            update={"tools": tuple(t for t in request.tools if t.name != "tests__crash")}
        )

    async def before_tool_call(self, ctx: ToolCallContext, call: ToolCall) -> None:
        self.before.append(call.name)

    async def after_tool_result(self, ctx: ToolCallContext, result: ToolResult) -> None:
        self.after.append((ctx.tool_name, result.state))


async def test_destructive_waits_for_approval_read_only_runs_at_once(
    runtime_for: Any, http_server: HttpTestServer
) -> None:
    model = ScriptedModel(
        [
            tool_calls_response(
                ScriptedToolCall("tests__lookup", {"key": "a"}, "c1"),
                ScriptedToolCall("tests__delete_record", {"record_id": "r1"}, "c2"),
            ),
            text_response("deleted"),
        ]
    )
    hooks = Hooks()
    rt = await runtime_for(
        Agent(model=model, mcp_servers=[http_tools_of(http_server)], lifecycle=hooks)
    )
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "delete r1")
    waiting = await rt.wait_status(thread_id, RunStatus.WAITING, timeout=RUN_TIMEOUT)
    names = offered(model.calls[0])
    assert "tests__delete_record" in names and "tests__crash" not in names  # narrowed
    lookup, delete = tool_parts(waiting)
    assert lookup.state is ToolState.OUTPUT_AVAILABLE
    assert lookup.output == {"key": "a", "value": "A"}
    assert delete.state is ToolState.AWAITING_ACTION
    (action,) = waiting.pending_actions
    assert action.payload_schema["required"] == ["approved"]
    assert [e["key"] for e in http_server.events("lookup")] == ["a"]
    assert http_server.events("delete_record") == []  # nothing ran before the approval
    # A second client (another user of the scope) approves; the action runs once.
    await rt.service.resume_action(BOB, thread_id, action.id, {"approved": True})
    final = await rt.wait_for(thread_id, settled, RUN_TIMEOUT)
    assert final.run is not None and final.run.status is RunStatus.COMPLETED
    _, delete = tool_parts(final)
    assert delete.state is ToolState.OUTPUT_AVAILABLE and delete.output == {"result": "deleted r1"}
    assert len(http_server.events("delete_record")) == 1
    # The hooks ran on MCP tools like on any tool: before for both calls, again on resume.
    assert hooks.before == ["tests__lookup", "tests__delete_record", "tests__delete_record"]
    assert ("tests__delete_record", ToolState.OUTPUT_AVAILABLE) in hooks.after


async def test_a_refused_call_never_reaches_the_server(
    runtime_for: Any, http_server: HttpTestServer
) -> None:
    model = ScriptedModel(
        [
            tool_call_response("tests__delete_record", {"record_id": "r2"}, id="c1"),
            text_response("not deleted"),
        ]
    )
    rt = await runtime_for(Agent(model=model, mcp_servers=[http_tools_of(http_server)]))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "delete r2")
    waiting = await rt.wait_status(thread_id, RunStatus.WAITING, timeout=RUN_TIMEOUT)
    (action,) = waiting.pending_actions
    await rt.service.resume_action(BOB, thread_id, action.id, {"approved": False, "note": "no"})
    final = await rt.wait_for(thread_id, settled, RUN_TIMEOUT)
    (delete,) = tool_parts(final)
    assert delete.state is ToolState.OUTPUT_ERROR and delete.error is not None
    assert "no" in delete.error
    assert http_server.events("delete_record") == []


def progress_of(recorder: Recorder) -> list[float]:
    return [
        f["chunk"]["progress"] for f in recorder.chunks() if f["chunk"]["type"] == "tool-progress"
    ]


async def test_progress_reaches_every_watcher_and_stop_cancels_the_call(
    runtime_for: Any, http_server: HttpTestServer
) -> None:
    model = ScriptedModel([tool_call_response("tests__slow_count", {"steps": 300}, id="c1")])
    rt = await runtime_for(Agent(model=model, mcp_servers=[http_tools_of(http_server)]))
    thread_id = await rt.thread()
    async with rt.record(thread_id) as first, rt.record(thread_id) as second:
        admission = await rt.service.send_message(ALICE, thread_id, "count")
        await eventually(lambda: len(progress_of(first)) >= 3 and len(progress_of(second)) >= 3)
        assert progress_of(first)[:3] == progress_of(second)[:3] == [1.0, 2.0, 3.0]
        assert admission.run_id is not None
        await rt.service.stop_run(ALICE, thread_id, admission.run_id)
        final = await rt.wait_status(thread_id, RunStatus.CANCELLED, timeout=RUN_TIMEOUT)
    (part,) = tool_parts(final)
    assert part.state is ToolState.CANCELLED
    # The server saw MCP's cancellation and stopped counting.
    await eventually(lambda: bool(http_server.events("slow_count.cancelled")))
    assert http_server.events("slow_count.done") == []


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_a_crashed_server_is_an_error_and_the_next_call_works(
    runtime_for: Any, http_server: HttpTestServer, tmp_path: Path, transport: str
) -> None:
    if transport == "http":
        server: MCPHttp | MCPStdio = http_tools_of(http_server)
        events = http_server.events
    else:
        log = tmp_path / "stdio-events.log"
        server = MCPStdio(
            name="tests",
            command=sys.executable,
            args=[str(SERVER), "stdio"],
            env={"MCP_TEST_LOG": str(log)},
            connect_timeout=60,
        )
        events = HttpTestServer(port=0, log=log, env={}).events
    model = ScriptedModel(
        [
            tool_call_response("tests__crash", {}, id="c1"),
            tool_call_response("tests__lookup", {"key": "after"}, id="c2"),
            text_response("recovered"),
        ]
    )
    rt = await runtime_for(Agent(model=model, mcp_servers=[server]))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "crash it")
    final = await rt.wait_for(thread_id, settled, RUN_TIMEOUT * 2)
    assert final.run is not None and final.run.status is RunStatus.COMPLETED, final
    crashed, after = tool_parts(final)
    assert crashed.state is ToolState.OUTPUT_ERROR and crashed.error is not None
    assert after.state is ToolState.OUTPUT_AVAILABLE, after
    assert after.output == {"key": "after", "value": "AFTER"}
    pids = {e["pid"] for e in events()}
    assert len(pids) == 2  # the crashed process and the one started (or reconnected) after


async def test_the_tool_list_is_refreshed_on_list_changed(
    runtime_for: Any, http_server: HttpTestServer
) -> None:
    model = ScriptedModel(
        [
            tool_call_response("tests__add_tool", {}, id="c1"),
            tool_call_response("tests__echo", {"text": "hi"}, id="c2"),
            text_response("echoed"),
        ]
    )
    rt = await runtime_for(Agent(model=model, mcp_servers=[http_tools_of(http_server)]))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "grow")
    final = await rt.wait_for(thread_id, settled, RUN_TIMEOUT)
    assert "tests__echo" not in offered(model.calls[0])
    assert "tests__echo" in offered(model.calls[1])
    _, echo = tool_parts(final)
    assert echo.state is ToolState.OUTPUT_AVAILABLE and echo.output == {"result": "hi"}
