"""Long replies: 200 KB commits in full (several text parts), 2 MB ends with the marker."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from runtime.agent import Agent
from runtime.domain import MAX_TEXT_CHARS, MessageRole, RunStatus, TextPart
from runtime.engine.streaming import MAX_STEP_TEXT_CHARS, TRUNCATION_MARKER
from runtime.providers.model_api import FinishDelta, ModelDelta, ModelRequest, TextDelta
from runtime.providers.model_context import message_text
from runtime.providers.scripted import FunctionModel
from tests.faults.conftest import via
from tests.faults.invariants import check_store
from tests.faults.proxy import ProxyFactory
from tests.faults.runtime import ALICE, fault_runtime

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

PIECE = 16 * 1024


async def long_echo(request: ModelRequest) -> AsyncIterator[ModelDelta]:
    """Answers "reply N" with N characters (a pattern, so any loss or reorder shows)."""
    match = re.search(r"reply (\d+)", message_text(request.messages[-1].parts))
    size = int(match.group(1)) if match else 10
    text = "".join(f"{i:07d} " for i in range(size // 8 + 1))[:size]
    for start in range(0, size, PIECE):
        yield TextDelta(text=text[start : start + PIECE])
    yield FinishDelta(reason="stop")


def expected(size: int) -> str:
    return "".join(f"{i:07d} " for i in range(size // 8 + 1))[:size]


async def test_long_replies_commit(database: str, make_proxy: ProxyFactory) -> None:
    agent = Agent(model=FunctionModel(long_echo), name="long")
    sizes = (200 * 1024, 2 * 1024 * 1024)
    async with make_proxy() as proxy:
        async with fault_runtime(database, via(database, proxy), agent=agent) as rt:
            for size in sizes:
                snapshot = await rt.service.create_thread(ALICE, title=f"long {size}")
                thread_id = snapshot.thread.id
                await rt.watch(thread_id)
                await rt.service.send_message(ALICE, thread_id, f"reply {size}")
                final = await rt.settle(thread_id, timeout=60)
                assert final.run is not None and final.run.status is RunStatus.COMPLETED
                reply = [m for m in final.messages if m.role is MessageRole.ASSISTANT]
                assert len(reply) == 1
                parts = reply[0].parts
                assert all(isinstance(p, TextPart) for p in parts)
                assert all(len(p.text) <= MAX_TEXT_CHARS for p in parts)  # type: ignore[union-attr]
                text = "".join(p.text for p in parts)  # type: ignore[union-attr]
                if size <= MAX_STEP_TEXT_CHARS:
                    assert text == expected(size)
                    assert len(parts) == -(-size // MAX_TEXT_CHARS)
                else:
                    assert len(text) == MAX_STEP_TEXT_CHARS
                    assert text.endswith(TRUNCATION_MARKER)
                    kept = MAX_STEP_TEXT_CHARS - len(TRUNCATION_MARKER)
                    assert text[:kept] == expected(size)[:kept]
        # check_store compares the snapshot text with what was streamed, chunk by chunk.
        report = await check_store(database, rt.observed)
    print(f"\nlong replies: iterations={len(sizes)} faults injected=0 {report.summary()}")
    assert report.violations == []
