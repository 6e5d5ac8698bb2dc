"""Run control signals on the bus: wakeups and stops for workers, never forwarded to clients."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

# The bus channel workers listen on (the bus backend adds its own prefix).
CONTROL_CHANNEL = "control"


class _Signal(BaseModel):
    # Fields a newer sender adds are ignored, so a worker still takes the signal during a
    # rolling upgrade; the fields it knows are checked.
    model_config = ConfigDict(frozen=True, extra="ignore")


class WakeupEnvelope(_Signal):
    """Work is available: a specific run, or any queued work when `run_id` is None."""

    type: Literal["wakeup"] = "wakeup"
    run_id: str | None = None
    # The run's thread, when the sender knows it: the worker reads the thread's messages with
    # the run's start (`Store.start_run`).
    thread_id: str | None = None
    # W3C trace context of the request that made the work: the episode's span links to it.
    # Left out of the encoding when absent, so wakeups without a trace stay as they were.
    traceparent: str | None = Field(default=None, exclude_if=lambda value: value is None)


class StopEnvelope(_Signal):
    """The worker executing `run_id` must stop it."""

    type: Literal["stop"] = "stop"
    run_id: str


ControlMessage: TypeAlias = Annotated[WakeupEnvelope | StopEnvelope, Field(discriminator="type")]
CONTROL_MESSAGE_ADAPTER: TypeAdapter[WakeupEnvelope | StopEnvelope] = TypeAdapter(ControlMessage)


def decode_control(data: bytes) -> WakeupEnvelope | StopEnvelope:
    """Parse a control-channel message; raises `pydantic.ValidationError` on anything else."""
    return CONTROL_MESSAGE_ADAPTER.validate_json(data)


def encode_wakeup(
    run_id: str | None = None, thread_id: str | None = None, traceparent: str | None = None
) -> bytes:
    """`encode(WakeupEnvelope(run_id=..., thread_id=..., traceparent=...))`, byte for byte,
    without building the model."""
    for name, value in (("run_id", run_id), ("thread_id", thread_id), ("tp", traceparent)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string or None")
    envelope = {"type": "wakeup", "run_id": run_id, "thread_id": thread_id}
    if traceparent is not None:
        envelope["traceparent"] = traceparent
    return orjson.dumps(envelope)


def encode_stop(run_id: str) -> bytes:
    """`encode(StopEnvelope(run_id=...))`, byte for byte, without building the model."""
    if not isinstance(run_id, str):
        raise ValueError("run_id must be a string")
    return orjson.dumps({"type": "stop", "run_id": run_id})
