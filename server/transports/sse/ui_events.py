"""One base for the UI event protocols: a run's typed chunks in, a protocol's events out."""

from __future__ import annotations

import logging
from typing import Generic, TypeVar

from pydantic import ValidationError

from runtime.domain import ToolCallPart, ToolState
from server.transports.sse.thread_stream import Chunk
from threadline_wire.chunks import (
    StepFinishChunk,
    StepStartChunk,
    StreamChunkAdapter,
    TextDeltaChunk,
    ToolCallChunk,
    ToolStateChunk,
)

log = logging.getLogger(__name__)
E = TypeVar("E")

# Tool states that end a tool call with a result.
FINAL_STATES = frozenset(
    {
        ToolState.OUTPUT_AVAILABLE,
        ToolState.OUTPUT_ERROR,
        ToolState.REJECTED,
        ToolState.CANCELLED,
        ToolState.SKIPPED,
    }
)


class UIEventStream(Generic[E]):
    """Turns one run's canonical chunks, parsed into their typed models, into events `E`.

    The base keeps what every UI protocol needs to know across chunks (the open text message
    and its streaming id, each tool call's name) and calls one `handle_*` hook per event; a
    protocol subclasses it and overrides the hooks it has events for (each returns the events,
    none by default), as pydantic-ai's `ui/_event_stream.py` does for AG-UI and Vercel.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.text_id: str | None = None
        self.texts = 0
        self.tool_names: dict[str, str] = {}

    def chunk(self, chunk: Chunk) -> list[E]:
        """The events of one canonical chunk (a chunk of no interest, or unreadable, has none)."""
        try:
            typed = StreamChunkAdapter.validate_python(chunk.chunk)
        except ValidationError:
            log.warning("ui stream: dropping an unreadable chunk: %.80r", chunk.chunk)
            return []
        if isinstance(typed, StepStartChunk):
            return self.handle_step_start(typed)
        if isinstance(typed, StepFinishChunk):
            return self.handle_step_finish(typed)
        if isinstance(typed, TextDeltaChunk):
            if not typed.delta:
                return []
            events: list[E] = []
            if self.text_id is None:
                self.texts += 1
                self.text_id = f"{chunk.run_id}-{self.texts}"
                events += self.handle_text_start(self.text_id)
            return [*events, *self.handle_text_delta(self.text_id, typed.delta)]
        if isinstance(typed, ToolCallChunk):
            self.tool_names[typed.tool_call_id] = typed.name
            return self.handle_tool_call(typed, parent=self.text_id)
        if isinstance(typed, ToolStateChunk):
            return self._tool_state(typed)
        return []  # run-takeover: the feed resynchronises, the snapshot settles it

    def _tool_state(self, chunk: ToolStateChunk) -> list[E]:
        try:
            state = ToolState(chunk.state)
        except ValueError:
            return []
        if state not in FINAL_STATES:
            return []  # intermediate states: the closing snapshot settles them
        part = ToolCallPart(
            tool_call_id=chunk.tool_call_id,
            name=self.tool_names.get(chunk.tool_call_id, "tool"),
            state=state,
            output=chunk.output,
            error=chunk.error,
        )
        return self.handle_tool_result(part)

    def close_text(self) -> list[E]:
        """End the open text message, if any."""
        if self.text_id is None:
            return []
        text_id, self.text_id = self.text_id, None
        return self.handle_text_end(text_id)

    # --- hooks: a protocol's events for each (none by default) ------------------------------

    def handle_step_start(self, chunk: StepStartChunk) -> list[E]:
        return []

    def handle_step_finish(self, chunk: StepFinishChunk) -> list[E]:
        return self.close_text()

    def handle_text_start(self, text_id: str) -> list[E]:
        return []

    def handle_text_delta(self, text_id: str, delta: str) -> list[E]:
        return []

    def handle_text_end(self, text_id: str) -> list[E]:
        return []

    def handle_tool_call(self, chunk: ToolCallChunk, *, parent: str | None) -> list[E]:
        """A complete tool call; `parent` is the text message open before it (closed by the
        base's caller when the subclass calls `close_text`)."""
        return self.close_text()

    def handle_tool_result(self, part: ToolCallPart) -> list[E]:
        """A tool call reached a final state (FINAL_STATES)."""
        return self.close_text()
