"""One model step's stream: provider deltas -> raw chunks -> transform_step_stream -> published."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from runtime.domain import MAX_TEXT_CHARS, TextPart
from runtime.engine.modeltrace import ModelCallTrace
from runtime.engine.publisher import Publisher
from runtime.lifecycle import AgentLifecycle, StepContext
from runtime.providers.model_api import (
    Model,
    ModelDelta,
    ModelRequest,
    ResponseDelta,
    TextDelta,
    UsageDelta,
)
from runtime.providers.parts import StepAssembler
from threadline_wire.chunks import StreamChunk, TextDeltaChunk, ToolCallChunk

# A step's text commits in full up to this bound (docs/architecture.md, "Long replies"), split
# into text parts of at most MAX_TEXT_CHARS; the marker ends a step whose text would exceed it.
MAX_STEP_TEXT_CHARS = 1024 * 1024
TRUNCATION_MARKER = "\n\n[truncated: the reply exceeded 1 MiB]"


def step_text_parts(text: str) -> list[TextPart]:
    """A step's text as stored: consecutive parts that concatenate to it exactly."""
    return [
        TextPart(text=text[i : i + MAX_TEXT_CHARS]) for i in range(0, len(text), MAX_TEXT_CHARS)
    ]


@dataclass
class StepOutput:
    """Canonical output of one step so far. Read by stop/failure handling after cancellation,
    so it always holds exactly what was already published."""

    text: str = ""
    tool_calls: list[ToolCallChunk] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)


class ChunkSink:
    """Assigns gap-free `seq` numbers per run and publishes canonical chunks live, each marked
    with the episode (fencing token) that streamed it.

    `emit` queues the encoded chunk; one flusher task publishes what is queued, in seq order,
    one bus operation per batch (`Publisher.chunks`): a chunk emitted while a batch is on the
    wire goes with the next one, so chunks produced back to back cost one round trip together
    and a lone chunk goes out at once. `drain` waits until every emitted chunk is published.

    A commit takes the queued chunks instead (`hold`), waits for the batch on the wire
    (`settle`), and publishes them with its invalidation, after the write, in one bus operation
    (`Publisher.committed`): chunks first, then the invalidation, as before, one round trip
    fewer. Chunks emitted meanwhile stay queued until `release`. So every chunk is published
    before the invalidation of the commit that holds it (and before the replay clear)."""

    # Chunks queued beyond this make `emit` wait for the flusher (backpressure).
    MAX_PENDING = 64

    def __init__(
        self,
        publisher: Publisher,
        thread_id: str,
        run_id: str,
        next_seq: int,
        episode: int = 0,
    ) -> None:
        self.publisher = publisher
        self.thread_id = thread_id
        self.run_id = run_id
        self.seq = next_seq
        self.episode = episode
        self._pending: list[bytes] = []
        self._flusher: asyncio.Task[None] | None = None
        self._held = False  # a commit holds the queue: no batch starts until `release`

    async def emit(self, chunk: StreamChunk) -> None:
        """Queue `chunk` with the next seq for publishing. The seq is taken and the chunk
        queued in one step, with no await in between: a stop that cancels the step never leaves
        a seq taken (the commit's `next_seq` counts it) but the chunk unpublished, and parallel
        tools emitting concurrently keep seq order on the wire. Once a stop's commit has
        published the chunks it holds and cleared the replay buffer, nothing emitted before is
        left to publish."""
        data = self.publisher.chunk_data(
            self.thread_id, self.run_id, self.seq, chunk.model_dump(mode="json"), self.episode
        )
        self.seq += 1
        self._pending.append(data)
        if self._flusher is None and not self._held:
            self._flusher = asyncio.create_task(self._flush())
        if len(self._pending) >= self.MAX_PENDING:
            await self.drain()

    async def drain(self) -> None:
        """Wait until every chunk emitted so far is published (or its publish failed: best
        effort, as every publish); while a commit holds the queue, until the batch on the wire
        is. A cancelled caller leaves the flusher running."""
        while self._flusher is not None:
            await asyncio.shield(self._flusher)

    def hold(self) -> list[bytes]:
        """For a commit: the queued chunks (seqs below `seq`, in order), taken for the caller
        to publish, and no new batch until `release`. No await: call it where the commit's
        `next_seq` is read, before a flusher started by the last `emit` takes them."""
        if self._held:
            raise RuntimeError("the chunk queue is already held by a commit")
        self._held = True
        taken, self._pending = self._pending, []
        return taken

    async def settle(self) -> None:
        """While held: wait until the batch on the wire (seqs before the held ones) is published."""
        await self.drain()

    def release(self) -> None:
        """The commit is done: chunks emitted meanwhile are published as usual."""
        self._held = False
        if self._pending and self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._pending and not self._held:
                batch, self._pending = self._pending, []
                await self.publisher.chunks(self.thread_id, batch)
        finally:
            self._flusher = None


async def primed(stream: AsyncIterator[ModelDelta]) -> AsyncIterator[ModelDelta]:
    """Start a provider stream so setup failures raise here, where around_model_call can catch
    them; later failures surface while the returned stream is consumed."""
    iterator = aiter(stream)
    try:
        first = await anext(iterator)
    except StopAsyncIteration:
        return _empty()
    return _prepend(first, iterator)


async def _empty() -> AsyncIterator[ModelDelta]:
    return
    yield  # pragma: no cover - makes this an async generator


async def _prepend(first: ModelDelta, rest: AsyncIterator[ModelDelta]) -> AsyncIterator[ModelDelta]:
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        # A stopped or failed step must close the provider stream (and its connection) now.
        aclose = getattr(rest, "aclose", None)
        if aclose is not None:
            await aclose()


async def model_chunks(
    deltas: AsyncIterator[ModelDelta], output: StepOutput, trace: ModelCallTrace
) -> AsyncIterator[StreamChunk]:
    """Normalise provider deltas into raw step chunks: text as it streams, tool calls complete.
    The model call's trace ends with the provider stream, before the tool calls are yielded."""
    assembler = StepAssembler()
    iterator = aiter(deltas)
    try:
        while True:
            with trace.waiting():
                try:
                    delta = await anext(iterator)
                except StopAsyncIteration:
                    break
            assembler.feed(delta)
            if isinstance(delta, TextDelta) and delta.text:
                yield TextDeltaChunk(delta=delta.text)
            elif isinstance(delta, UsageDelta):
                trace.usage(delta.input_tokens, delta.output_tokens)
            elif isinstance(delta, ResponseDelta):
                trace.response(delta.id, delta.model)
        result = assembler.result()
    except BaseException as exc:
        trace.end(None, exc)
        raise
    trace.end(result.finish_reason)
    output.finish_reason = result.finish_reason
    for call in result.tool_calls:
        yield ToolCallChunk(tool_call_id=call.id, name=call.name, input=_call_input(call))


def _call_input(call: Any) -> dict[str, Any]:
    # Arguments the model got wrong still become a call; the tool phase reports the error.
    if getattr(call, "error", None):
        return {"__invalid_arguments__": call.error}
    return dict(call.input or {})


async def text_chunks(text: str) -> AsyncIterator[StreamChunk]:
    """A Respond decision's text as a raw stream, so it passes the canonical transform too."""
    yield TextDeltaChunk(delta=text)


async def run_stream(
    lifecycle: AgentLifecycle,
    ctx: StepContext,
    raw: AsyncIterator[StreamChunk],
    sink: ChunkSink,
    output: StepOutput,
) -> None:
    """Drive the canonical stream: everything transform_step_stream yields is published and
    recorded; nothing else is. Text past `MAX_STEP_TEXT_CHARS` is not: the step's text is cut
    at the bound, the truncation marker is published and recorded, and the stream is closed."""
    limit = MAX_STEP_TEXT_CHARS - len(TRUNCATION_MARKER)
    # The model's tool calls as they enter the transform: the only ones it may yield.
    made: dict[str, str] = {}
    stream = lifecycle.transform_step_stream(ctx, _calls_seen(raw, made))
    try:
        async for chunk in stream:
            if isinstance(chunk, TextDeltaChunk) and len(output.text) + len(chunk.delta) > limit:
                room = limit - len(output.text)
                for delta in (chunk.delta[:room], TRUNCATION_MARKER):
                    if delta:
                        output.text += delta
                        await sink.emit(TextDeltaChunk(delta=delta))
                output.finish_reason = "length"
                return
            if isinstance(chunk, TextDeltaChunk):
                output.text += chunk.delta
            elif isinstance(chunk, ToolCallChunk):
                _check_call(chunk, made, output)
                output.tool_calls.append(chunk)
            # `output` first: the emit queues the chunk before its first await, so once a stop
            # cancels the step, every emitted chunk (published by the stop's commit at the
            # latest) is in `output` (which the stop then commits), and no other is.
            await sink.emit(chunk)
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


class ForgedToolCall(RuntimeError):
    """transform_step_stream yielded a tool call the model did not make (the phase table:
    this phase cannot call tools). It fails the run, like any error the hook raises."""


async def _calls_seen(
    raw: AsyncIterator[StreamChunk], made: dict[str, str]
) -> AsyncIterator[StreamChunk]:
    """`raw`, recording each tool call's id and name in `made` as it passes into the transform."""
    try:
        async for chunk in raw:
            if isinstance(chunk, ToolCallChunk):
                made[chunk.tool_call_id] = chunk.name
            yield chunk
    finally:
        # Closing the transform's input closes the model stream at once, as before.
        aclose = getattr(raw, "aclose", None)
        if aclose is not None:
            await aclose()


def _check_call(chunk: ToolCallChunk, made: dict[str, str], output: StepOutput) -> None:
    """A tool-call chunk the transform yields must be one of the model's calls of this step,
    with its id and name, once. Its input may differ: the transform is canonical, so a secret
    it redacts from the arguments is redacted in the stored call too (before_tool_call then
    sees that input, and the tool runs with it)."""
    if made.get(chunk.tool_call_id) != chunk.name:
        raise ForgedToolCall(
            f"transform_step_stream yielded a tool call the model did not make: "
            f"{chunk.name!r} ({chunk.tool_call_id})"
        )
    if any(call.tool_call_id == chunk.tool_call_id for call in output.tool_calls):
        raise ForgedToolCall(f"transform_step_stream yielded tool call {chunk.tool_call_id} twice")


def model_call(model: Model) -> Any:
    """The innermost call wrapped by around_model_call."""

    async def call(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        return await primed(model.stream(request))

    return call
