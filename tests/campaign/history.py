"""The campaign's history: every operation (invoke, then ok/fail/unknown) and every fault."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["ok", "fail", "unknown"]


@dataclass
class Op:
    """One client operation: invoked at `start`, answered (or timed out) at `end`."""

    index: int
    client: str
    kind: str
    thread_id: str | None
    args: dict[str, Any]
    start: float
    end: float | None = None
    outcome: Outcome | None = None
    status: int | None = None
    answer: Any = None

    def describe(self) -> str:
        return (
            f"#{self.index} {self.client} {self.kind} thread={self.thread_id} args={self.args}"
            f" -> {self.outcome} {self.status} {str(self.answer)[:160]}"
        )


@dataclass
class Fault:
    kind: str
    target: str
    start: float
    seconds: float = 0.0


@dataclass
class Stream:
    """One SSE answer (AG-UI or AI SDK) as a client read it: every event in order."""

    name: str  # client name + stream number
    transport: str  # "ag-ui" | "ai-sdk"
    thread_id: str
    start: float
    end: float | None = None
    status: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False  # AI SDK: `data: [DONE]` came
    closed: bool = False  # the server ended the stream (not cut, not abandoned)
    error: str | None = None


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    # Per websocket session (client name + connection number): the frames it received and the
    # snapshot versions it applied, in order.
    frames: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    snapshots: dict[str, list[int]] = field(default_factory=dict)
    streams: list[Stream] = field(default_factory=list)

    def invoke(self, client: str, kind: str, thread_id: str | None, **args: Any) -> Op:
        op = Op(len(self.ops), client, kind, thread_id, args, time.monotonic())
        self.ops.append(op)
        return op

    @staticmethod
    def complete(op: Op, outcome: Outcome, status: int | None = None, answer: Any = None) -> None:
        op.end, op.outcome, op.status, op.answer = time.monotonic(), outcome, status, answer

    def stream(self, client: str, transport: str, thread_id: str, purpose: str) -> Stream:
        """A new stream, named by client, transport, purpose (send or join) and number."""
        name = f"{client}/{transport}-{purpose}{len(self.streams)}"
        stream = Stream(name, transport, thread_id, time.monotonic())
        self.streams.append(stream)
        return stream

    def fault(self, kind: str, target: str, seconds: float = 0.0) -> None:
        self.faults.append(Fault(kind, target, time.monotonic(), seconds))

    def op_counts(self) -> Counter[str]:
        return Counter(f"{op.kind}:{op.outcome or 'pending'}" for op in self.ops)

    def stream_counts(self) -> Counter[str]:
        """SSE streams by transport and how they ended (closed by the server, or not)."""
        return Counter(
            f"{s.transport}:{'closed' if s.closed else s.status or 'none'}" for s in self.streams
        )

    def fault_counts(self) -> Counter[str]:
        return Counter(f.kind for f in self.faults)
