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
class History:
    ops: list[Op] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    # Per websocket session (client name + connection number): the frames it received and the
    # snapshot versions it applied, in order.
    frames: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    snapshots: dict[str, list[int]] = field(default_factory=dict)

    def invoke(self, client: str, kind: str, thread_id: str | None, **args: Any) -> Op:
        op = Op(len(self.ops), client, kind, thread_id, args, time.monotonic())
        self.ops.append(op)
        return op

    @staticmethod
    def complete(op: Op, outcome: Outcome, status: int | None = None, answer: Any = None) -> None:
        op.end, op.outcome, op.status, op.answer = time.monotonic(), outcome, status, answer

    def fault(self, kind: str, target: str, seconds: float = 0.0) -> None:
        self.faults.append(Fault(kind, target, time.monotonic(), seconds))

    def op_counts(self) -> Counter[str]:
        return Counter(f"{op.kind}:{op.outcome or 'pending'}" for op in self.ops)

    def fault_counts(self) -> Counter[str]:
        return Counter(f.kind for f in self.faults)
