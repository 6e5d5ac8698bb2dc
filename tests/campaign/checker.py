"""The checker: the history and the final committed state against Threadline's promises."""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import orjson

from tests.campaign.history import History, Op
from tests.campaign.stream_rules import StreamRules
from tests.faults.invariants import ACTIVE_RUNS, check_store

SEND_KINDS = ("send", "send_retry")


@dataclass
class Committed:
    """The final committed state, read straight from Postgres."""

    messages: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    queued: list[dict[str, Any]]
    audit: list[str] = field(default_factory=list)


async def read_committed(dsn: str) -> Committed:
    conn = await asyncpg.connect(dsn)
    try:
        messages = [
            dict(r)
            for r in await conn.fetch(
                "SELECT id, thread_id, position, role, parts, run_id FROM messages"
                " ORDER BY thread_id, position"
            )
        ]
        runs = [dict(r) for r in await conn.fetch("SELECT id, thread_id, status FROM runs")]
        queued = [
            dict(r)
            for r in await conn.fetch(
                "SELECT thread_id, text FROM queued_items WHERE status = 'queued'"
            )
        ]
    finally:
        await conn.close()
    for message in messages:
        message["parts"] = orjson.loads(message["parts"])
    audit = (await check_store(dsn)).violations
    return Committed(messages, runs, queued, audit)


def _text(parts: Sequence[Mapping[str, Any]]) -> str:
    return "".join(p.get("text", "") for p in parts if p.get("type") == "text")


@dataclass
class Checker:
    history: History
    committed: Committed
    seed: int
    # session -> (its last applied snapshot, the committed snapshot fetched after the settle)
    finals: dict[str, tuple[dict[str, Any] | None, dict[str, Any]]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    # What a loaded box left undecided (reported, never a violation).
    unknown: list[str] = field(default_factory=list)
    # The settle hit its cap while runs still moved: unsettled runs are unknown, not stuck.
    still_moving: bool = False

    def flag(self, rule: str, detail: str, ops: Sequence[Op] = ()) -> None:
        lines = [f"[seed {self.seed}] {rule}: {detail}"]
        lines += [f"    {op.describe()}" for op in ops[:12]]
        self.violations.append("\n".join(lines))

    def run(self) -> list[str]:
        self.sends()
        self.actions()
        self.replies()
        self.runs()
        self.sessions()
        self.streams()
        for problem in self.committed.audit:
            self.flag("store audit", problem)
        return self.violations

    def sends(self) -> None:
        """Every acknowledged send exactly once; an unknown one at most once; a refused one
        never (retries with one client_request_id are one logical send)."""
        user_texts = [_text(m["parts"]) for m in self.committed.messages if m["role"] == "user"]
        user_texts += [str(q["text"]) for q in self.committed.queued]
        groups: dict[str, list[Op]] = defaultdict(list)
        cancels: dict[str, list[Op]] = defaultdict(list)
        for op in self.history.ops:
            if op.kind in SEND_KINDS:
                groups[op.args["marker"]].append(op)
            elif op.kind == "cancel":
                # By item (a send's answer names it) and by the marker the item's text shows
                # (an AG-UI send's answer is a stream, which names no queued item).
                cancels[op.args["item_id"]].append(op)
                if op.args.get("marker"):
                    cancels[op.args["marker"]].append(op)
        for marker, ops in groups.items():
            # \b: m-c1-1 is not m-c1-10.
            pattern = re.compile(rf"\b{re.escape(marker)}\b")
            count = sum(bool(pattern.search(text)) for text in user_texts)
            aimed = "".join(
                f" ({f.kind} {f.target})" for f in self.history.faults if pattern.search(f.target)
            )
            outcomes = {op.outcome for op in ops}
            items = {op.answer.get("queued_item_id") for op in ops if isinstance(op.answer, dict)}
            cancelled = [c for key in {*items, marker} if key for c in cancels[key]]
            if any(c.outcome == "ok" for c in cancelled):
                if count:
                    self.flag("cancelled send", f"{marker} cancelled yet committed{aimed}", ops)
            elif any(c.outcome == "unknown" for c in cancelled):
                if count > 1:
                    self.flag("acknowledged send", f"{marker} committed {count} times{aimed}", ops)
            elif "ok" in outcomes and count != 1:
                self.flag(
                    "acknowledged send",
                    f"{marker} committed {count} times{aimed}",
                    [*ops, *self._rewrites_after(ops)],
                )
            elif "ok" not in outcomes and count > 1:
                self.flag("unacknowledged send", f"{marker} committed {count} times{aimed}", ops)
            elif outcomes <= {"fail"} and count:
                self.flag("refused send", f"{marker} refused yet committed{aimed}", ops)

    def _rewrites_after(self, ops: Sequence[Op]) -> list[Op]:
        """The acknowledged rewrites of the sends' thread once the first was invoked: the
        operations that may explain a send gone missing."""
        thread, start = ops[0].thread_id, ops[0].start
        return [
            op
            for op in self.history.ops
            if op.kind in ("regenerate", "retry", "cancel", "stop", "hide")
            and op.thread_id == thread
            and op.outcome != "fail"
            and (op.end or start) >= start
        ]

    def actions(self) -> None:
        """An action resolved at most once, and by the resolver that got 200."""
        resolved: dict[str, str | None] = {}
        for message in self.committed.messages:
            for part in message["parts"]:
                waiting = part.get("waiting") if part.get("type") == "tool-call" else None
                if waiting:
                    resolution = waiting.get("resolution")
                    resolved[waiting["action_id"]] = resolution and resolution["subject"]
        by_action: dict[str, list[Op]] = defaultdict(list)
        for op in self.history.ops:
            if op.kind == "resume":
                by_action[op.args["action_id"]].append(op)
        stops: dict[str, list[Op]] = defaultdict(list)
        for op in self.history.ops:
            if op.kind == "stop" and op.outcome == "ok":
                stops[op.args["run_id"]].append(op)
        for action_id, ops in by_action.items():
            winners = [op for op in ops if op.outcome == "ok"]
            for won in winners:
                # Real-time order: a stop acknowledged before the resume was even sent cancels
                # the action; a 200 for that resume is a lie.
                earlier = [s for s in stops[won.args["run_id"]] if (s.end or 0) < won.start]
                if earlier:
                    self.flag("resume after stop", f"{action_id} answered 200", [*earlier, won])
            if len(winners) > 1:
                self.flag("action resolved twice", f"{action_id}: {len(winners)} got 200", ops)
            elif winners and action_id in resolved:
                subject = winners[0].args["subject"]
                if resolved[action_id] != subject:
                    self.flag(
                        "action resolver",
                        f"{action_id}: {subject} got 200, committed {resolved[action_id]}",
                        ops,
                    )

    def replies(self) -> None:
        """No run with two assistant replies for one step (the same text part twice)."""
        texts: dict[str, list[str]] = defaultdict(list)
        for message in self.committed.messages:
            if message["role"] == "assistant" and message["run_id"]:
                texts[message["run_id"]] += [
                    p["text"] for p in message["parts"] if p.get("type") == "text"
                ]
        for run_id, parts in texts.items():
            if len(parts) != len(set(parts)):
                self.flag("two replies", f"run {run_id} committed a reply twice: {parts[:4]}")

    def runs(self) -> None:
        """After the settle every run is terminal, or waiting on a pending action."""
        pending_runs = {
            m["run_id"]
            for m in self.committed.messages
            for p in m["parts"]
            if p.get("type") == "tool-call" and p.get("state") == "awaiting-action"
        }
        waiting = {r["thread_id"] for r in self.committed.runs if r["status"] == "waiting"}
        found: list[tuple[str, str]] = []
        for item in self.committed.queued:
            if item["thread_id"] not in waiting:
                found.append(("stuck queue", f"{item['thread_id']}: {item['text']!r} still queued"))
        for run in self.committed.runs:
            status = run["status"]
            if status in ACTIVE_RUNS and not (status == "waiting" and run["id"] in pending_runs):
                found.append(
                    ("unsettled run", f"run {run['id']} of {run['thread_id']} is {status}")
                )
        for rule, detail in found:
            if self.still_moving:
                self.unknown.append(f"{rule}: {detail} (still moving at the settle's cap)")
            else:
                self.flag(rule, detail)

    def streams(self) -> None:
        """Every AG-UI and AI SDK stream: framing, and what a finished one showed
        (`stream_rules.py`)."""
        committed = self.committed
        rules = StreamRules(
            committed.messages,
            committed.runs,
            self.history.faults,
            lambda rule, detail: self.flag(rule, detail),
        )
        for stream in self.history.streams:
            rules.check(stream)

    def sessions(self) -> None:
        """Per websocket session: invalidations strictly increasing, applied snapshots never
        older, no chunk of a superseded episode after its takeover, and the last snapshot of
        every live session equal to the committed one."""
        for session, frames in self.history.frames.items():
            versions = [int(f["version"]) for f in frames if f.get("type") == "invalidate"]
            if any(b <= a for a, b in itertools.pairwise(versions)):
                self.flag("versions", f"{session} saw invalidations {versions[-12:]}")
            newest: dict[str, int] = {}
            for frame in frames:
                if frame.get("type") != "chunk":
                    continue
                run_id, episode = frame["run_id"], int(frame.get("episode", 0))
                if frame["chunk"].get("type") == "run-takeover":
                    newest[run_id] = max(newest.get(run_id, 0), episode)
                elif episode < newest.get(run_id, 0):
                    self.flag("stale chunk", f"{session}: {frame} after the takeover")
                    break
        for session, applied in self.history.snapshots.items():
            if applied != sorted(applied):
                self.flag("versions", f"{session} applied snapshots {applied[-12:]}")
        for session, (held, committed) in self.finals.items():
            if held != committed:
                have = held and held["thread"]["version"]
                self.flag(
                    "convergence",
                    f"{session} holds version {have}, committed {committed['thread']['version']}",
                )
