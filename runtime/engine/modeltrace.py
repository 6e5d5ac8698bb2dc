"""The model-call span and GenAI metrics: what the model cost, not what the step did with it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace

from runtime import instruments


def _server(base_url: Any) -> dict[str, Any]:
    """`server.address` and `server.port` of a provider's base URL (none without one)."""
    if not isinstance(base_url, str) or not base_url:
        return {}
    with contextlib.suppress(ValueError):
        parts = urlsplit(base_url)
        if parts.hostname:
            default = 443 if parts.scheme == "https" else 80
            return {"server.address": parts.hostname, "server.port": parts.port or default}
    return {}


class ModelCallTrace:
    """One model call, traced with OpenTelemetry GenAI attributes (`gen_ai.*`).

    The span follows the GenAI semantic conventions: `chat {model}`, kind CLIENT, the
    provider's name and model id, the response's id and model, finish reasons, usage and the
    provider's `server.address`.

    The provider stream is read by the step itself: between two deltas the step transforms and
    publishes what it got. None of that is the model's, so the `chat {model}` span
    measures only the time spent awaiting the provider (`waiting`: the call through
    around_model_call, then each delta): it starts when the call starts and its duration is
    that time, so it ends at start + awaited time, not when the stream was closed. The wall
    time from the call to the end of the provider stream is the attribute
    `threadline.model_call.elapsed_s`. The duration metrics count the same awaited time."""

    def __init__(self, model: Any, run_id: str, step: int) -> None:
        self.model = str(getattr(model, "name", "model"))
        # GenAI conventions: the model id as the provider knows it, and who the provider is.
        self.request_model = request_model = str(getattr(model, "model", None) or self.model)
        self.provider = provider = str(getattr(model, "provider", None) or "threadline")
        self.started_ns = time.time_ns()
        self.started = time.perf_counter()
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": request_model,
            "threadline.model": self.model,
            "threadline.run_id": run_id,
            "threadline.step": step,
        }
        attributes.update(_server(getattr(model, "base_url", None)))
        self.span = instruments.start_span(
            f"chat {request_model}",
            start_time=self.started_ns,
            kind=trace.SpanKind.CLIENT,
            **attributes,
        )
        self.waited = 0.0
        self.input_tokens = 0
        self.output_tokens = 0
        self.ended = False

    def response(self, response_id: str | None, model: str | None) -> None:
        """The provider's id and model of the response (`ResponseDelta`)."""
        with contextlib.suppress(Exception):
            if response_id:
                self.span.set_attribute("gen_ai.response.id", response_id)
            if model:
                self.span.set_attribute("gen_ai.response.model", model)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Around every await on the model (setup and each delta)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.waited += time.perf_counter() - started

    def usage(self, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        attributes = {"gen_ai.request.model": self.model}
        instruments.safe_add(instruments.TOKENS, input_tokens, {"kind": "input", **attributes})
        instruments.safe_add(instruments.TOKENS, output_tokens, {"kind": "output", **attributes})

    def end(self, finish_reason: str | None, error: BaseException | None = None) -> None:
        """End the span once (a stop may reach here twice: from the stream and the step)."""
        if self.ended:
            return
        self.ended = True
        base = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.provider,
            "gen_ai.request.model": self.request_model,
        }
        instruments.safe_record(instruments.MODEL_CALL_DURATION, self.waited, {"model": self.model})
        if error is None:
            instruments.safe_record(instruments.GEN_AI_OPERATION_DURATION, self.waited, base)
            for kind, count in (("input", self.input_tokens), ("output", self.output_tokens)):
                instruments.safe_record(
                    instruments.GEN_AI_TOKEN_USAGE, count, {**base, "gen_ai.token.type": kind}
                )
        with contextlib.suppress(Exception):
            self.span.set_attribute("gen_ai.usage.input_tokens", self.input_tokens)
            self.span.set_attribute("gen_ai.usage.output_tokens", self.output_tokens)
            self.span.set_attribute("threadline.model_call.wait_s", self.waited)
            elapsed = time.perf_counter() - self.started
            self.span.set_attribute("threadline.model_call.elapsed_s", elapsed)
            if finish_reason is not None:
                self.span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
            if error is not None:
                instruments.fail_span(self.span, error)
            self.span.end(end_time=self.started_ns + int(self.waited * 1e9))
