"""The checker's rules for SSE streams (AG-UI and AI SDK): well-formed framing, and what a
finished stream showed against what was committed."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from tests.campaign.history import Fault, Stream

Flag = Callable[[str, str], None]
TERMINAL_RUNS = ("completed", "cancelled", "failed")
AGUI_ENDS = ("RUN_FINISHED", "RUN_ERROR")
# A fault's effects outlast its own span: a killed process restarting, Redis coming back and
# every gateway resubscribing, a pool reconnecting. A stream is calm past this margin.
HEAL_MARGIN = 3.0


def sequence(stream: Stream) -> str:
    """A stream's events as the checker reports them: every type in order, errors in full, and
    the end it had (`[DONE]`, closed by the server, or cut)."""
    shown = [
        orjson.dumps(e).decode() if e.get("type") in ("RUN_ERROR", "error") else str(e.get("type"))
        for e in stream.events[:40]
    ]
    if len(stream.events) > 40:
        shown.append(f"... {len(stream.events) - 40} more")
    end = "[DONE]" if stream.done else "closed" if stream.closed else f"cut ({stream.error})"
    return f"[{', '.join(shown)}] then {end}"


def text_of(parts: Sequence[Mapping[str, Any]]) -> str:
    return "".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")


class StreamRules:
    """`check(stream)` flags through `flag(rule, detail)`."""

    def __init__(
        self,
        messages: Sequence[Mapping[str, Any]],
        runs: Sequence[Mapping[str, Any]],
        faults: Sequence[Fault],
        flag: Flag,
    ) -> None:
        self.flag = flag
        self.faults = faults
        self.texts = {str(m.get("id")): text_of(m["parts"]) for m in messages}
        self.message_run = {str(m.get("id")): m["run_id"] for m in messages}
        self.status = {str(r["id"]): str(r["status"]) for r in runs}
        self.run_text: dict[str, str] = defaultdict(str)
        for m in messages:  # read in position order
            if m["role"] == "assistant" and m["run_id"]:
                self.run_text[str(m["run_id"])] += text_of(m["parts"])

    def check(self, stream: Stream) -> None:
        if stream.status != 200 or not stream.events:
            return
        if stream.transport == "ag-ui":
            self.agui(stream)
        else:
            self.aisdk(stream)

    def framing(self, stream: Stream, detail: str) -> None:
        self.flag("stream framing", f"{detail}; events: {sequence(stream)}")

    def calm(self, stream: Stream) -> bool:
        """No fault struck (or was still being healed) while the stream was open."""
        return self.last_fault(stream) is None

    def last_fault(self, stream: Stream) -> Fault | None:
        """The last fault whose effects overlapped the stream, if any."""
        start, end = stream.start, stream.end or stream.start
        overlapping = [
            f for f in self.faults if f.start <= end and f.start + f.seconds + HEAL_MARGIN >= start
        ]
        return overlapping[-1] if overlapping else None

    def _open_texts(self, stream: Stream, start: str, delta: str, stop: str, key: str) -> None:
        """Every text delta inside an open text of its id."""
        open_ids: set[str] = set()
        for event in stream.events:
            kind = event.get("type")
            if kind == start:
                open_ids.add(str(event.get(key)))
            elif kind == stop:
                open_ids.discard(str(event.get(key)))
            elif kind == delta and str(event.get(key)) not in open_ids:
                self.framing(stream, f"{stream.name}: {kind} outside its text: {event}")
                return

    def agui(self, stream: Stream) -> None:
        events = stream.events
        # The AG-UI verifier (@ag-ui/client) takes RUN_ERROR as a first event: a stream
        # refused before its run started is that one event (nothing may follow, below).
        if events[0].get("type") not in ("RUN_STARTED", "RUN_ERROR"):
            self.framing(stream, f"{stream.name} began with {events[0].get('type')}")
        ends = [i for i, e in enumerate(events) if e.get("type") in AGUI_ENDS]
        if len(ends) > 1 or (ends and ends[0] != len(events) - 1):
            self.framing(stream, f"{stream.name}: events after the run's end")
        elif stream.closed and not ends:
            self.framing(stream, f"{stream.name} closed without RUN_FINISHED/RUN_ERROR")
        self._open_texts(
            stream, "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "messageId"
        )
        snapshots = [e for e in events if e.get("type") == "MESSAGES_SNAPSHOT"]
        followed = str(events[0].get("runId"))
        if not ends or not snapshots or self.status.get(followed) not in TERMINAL_RUNS:
            return
        # The closing snapshot is committed state once the followed run ended: its user
        # messages and that run's messages never change after (they may only be deleted).
        for message in snapshots[-1].get("messages") or []:
            message_id = str(message.get("id"))
            if message_id not in self.texts or message.get("role") not in ("user", "assistant"):
                continue
            if message.get("role") == "assistant" and self.message_run[message_id] != followed:
                continue
            shown, committed = message.get("content") or "", self.texts[message_id]
            if shown != committed:
                self.flag(
                    "stream convergence",
                    f"{stream.name}: message {message_id} shown {shown[:80]!r},"
                    f" committed {committed[:80]!r}",
                )

    def aisdk(self, stream: Stream) -> None:
        events = stream.events
        if events[0].get("type") != "start":
            self.framing(stream, f"{stream.name} began with {events[0].get('type')}")
            return
        finishes = [i for i, e in enumerate(events) if e.get("type") == "finish"]
        if len(finishes) > 1 or (finishes and finishes[0] != len(events) - 1):
            self.framing(stream, f"{stream.name}: chunks after finish")
        elif stream.done and not finishes and events[-1].get("type") != "error":
            # An `error` part may end the stream instead of `finish` (the AI SDK's own
            # createUIMessageStream does, and useChat ends in its error state).
            self.framing(stream, f"{stream.name}: [DONE] without finish or error")
        self._open_texts(stream, "text-start", "text-delta", "text-end", "id")
        run_id = str(events[0].get("messageId"))
        if not finishes or events[-1].get("finishReason") != "stop":
            return
        committed = self.run_text.get(run_id, "")
        if self.status.get(run_id) != "completed" or not committed or not self.calm(stream):
            return
        # A stream no fault touched shows the run's text exactly once: what was committed.
        shown = "".join(str(e.get("delta", "")) for e in events if e.get("type") == "text-delta")
        if shown != committed:
            at = next(
                (i for i, (a, b) in enumerate(zip(shown, committed, strict=False)) if a != b),
                min(len(shown), len(committed)),
            )
            self.flag(
                "stream text",
                f"{stream.name}: run {run_id} streamed {len(shown)} characters, committed"
                f" {len(committed)}; from character {at}: streamed {shown[at : at + 60]!r},"
                f" committed {committed[at : at + 60]!r}",
            )
