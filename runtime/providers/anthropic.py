"""Anthropic Messages provider via the official SDK, normalised into the common model deltas."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import anthropic
from anthropic import AsyncAnthropic
from anthropic.resources.messages import AsyncMessages

from runtime.domain import MessageRole
from runtime.providers.failures import (
    TRANSPORT_ERRORS,
    Phase,
    is_retryable_status,
    provider_failure,
)
from runtime.providers.model_api import (
    FinishDelta,
    ModelDelta,
    ModelRequest,
    ProviderError,
    ResponseDelta,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageDelta,
)
from runtime.providers.model_context import message_text, message_turns, tool_result_content
from runtime.providers.sdk import SdkModel, split_settings

PROVIDER = "anthropic"
# Anthropic's stop reasons in the vocabulary of FinishDelta (OpenAI's); others pass unchanged.
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}
# Error types of an `event: error` inside a 200 stream, with the HTTP status they stand for.
_STREAM_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_CREATE_PARAMS = frozenset(inspect.signature(AsyncMessages.create).parameters) - {"self"}


class AnthropicModel(SdkModel[AsyncAnthropic]):
    """Streams `messages.create(stream=True)`. `max_tokens` is required by the API; `settings`
    go with every request, overridden by `ModelRequest.settings`; unknown settings travel in
    the body as they are.

    The SDK client is created lazily on the running event loop and closed by `aclose()` /
    `async with`; an injected `client` is used as is and left open.
    """

    sdk_errors = (anthropic.AnthropicError,)

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 1024,
        *,
        client: AsyncAnthropic | None = None,
        max_retries: int = 2,
        timeout: float | None = 60.0,
        name: str | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(
            model,
            base_url,
            api_key,
            client=client,
            max_retries=max_retries,
            timeout=timeout,
            name=name,
            provider=PROVIDER,
            settings=settings,
        )
        self.max_tokens = max_tokens

    def _make_client(self) -> AsyncAnthropic:
        return AsyncAnthropic(
            api_key=self.api_key,
            base_url=self.base_url,
            max_retries=self.max_retries,
            timeout=self.timeout,
        )

    async def _open_stream(self, client: AsyncAnthropic, kwargs: dict[str, Any]) -> Any:
        return await client.messages.create(**kwargs)

    def _event_mapper(self) -> Callable[[Any], Iterable[ModelDelta]]:
        return EventMapper().map

    def _failure(self, phase: Phase, exc: BaseException) -> ProviderError:
        return _failure(phase, exc)

    def request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of `messages.create` for `request`."""
        settings = {"max_tokens": self.max_tokens, **self.settings, **request.settings}
        known, extra = split_settings(settings, _CREATE_PARAMS)
        system, messages = to_anthropic_messages(request)
        kwargs: dict[str, Any] = {
            **known,
            "model": self.model,
            "messages": messages,
            "stream": True,
        }
        if system:
            kwargs["system"] = system
        if request.tools:
            kwargs["tools"] = [to_anthropic_tool(spec) for spec in request.tools]
        if extra:
            kwargs["extra_body"] = {**known.get("extra_body", {}), **extra}
        return kwargs


def _failure(phase: Phase, exc: BaseException) -> ProviderError:
    if isinstance(exc, anthropic.APIStatusError):
        if exc.status_code < 400:
            # `event: error` inside a 200 stream: the error type says what happened.
            kind = str(exc.type or "error")
            status = _STREAM_ERROR_STATUS.get(kind)
            message = f"{kind}: {exc.api_message or exc.message}"
            return provider_failure(
                PROVIDER, phase, message, retryable=is_retryable_status(status), status=status
            )
        status = exc.status_code
        return provider_failure(
            PROVIDER, phase, exc.message, retryable=is_retryable_status(status), status=status
        )
    if isinstance(exc, (anthropic.APIConnectionError, *TRANSPORT_ERRORS)):
        return provider_failure(PROVIDER, phase, f"connection failed: {exc}", retryable=True)
    # Client-side configuration problems (no credentials, ...): retrying cannot help.
    return provider_failure(PROVIDER, phase, str(exc), retryable=False)


# --- conversion ---------------------------------------------------------------------------------


def to_anthropic_tool(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}


def to_anthropic_messages(request: ModelRequest) -> tuple[str, list[dict[str, Any]]]:
    """`(system, messages)`: instructions and system messages become the system prompt; tool
    calls become `tool_use` blocks answered by a user message of `tool_result` blocks.

    Consecutive messages of one role are merged, so a user message that follows tool results
    joins their user turn (results first, as the API requires).
    """
    system = [request.instructions] if request.instructions else []
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for message in request.messages:
        if message.role is MessageRole.SYSTEM:
            text = message_text(message.parts)
            if text:
                system.append(text)
            continue
        if message.role is MessageRole.USER:
            text = message_text(message.parts)
            # The API rejects empty text blocks.
            add("user", [{"type": "text", "text": text}] if text else [])
            continue
        for turn in message_turns(message.parts):
            blocks: list[dict[str, Any]] = []
            if turn.text:
                blocks.append({"type": "text", "text": turn.text})
            for call in turn.tool_calls:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.tool_call_id,
                        "name": call.name,
                        "input": call.input,
                    }
                )
            add("assistant", blocks)
            results = []
            for call in turn.tool_calls:
                result = tool_result_content(call)
                results.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": call.tool_call_id,
                        "content": result.text,
                        "is_error": result.is_error,
                    }
                )
            add("user", results)
    return "\n\n".join(system), messages


class EventMapper:
    """Maps raw Messages stream events to deltas. Anthropic reports usage as running totals
    (`message_start`, then `message_delta`); deltas carry increments, so totals are tracked."""

    def __init__(self) -> None:
        self.input_tokens = 0
        self.output_tokens = 0

    def map(self, event: Any) -> list[ModelDelta]:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            message = event.message
            deltas = self._usage(getattr(message, "usage", None))
            response_id, model = getattr(message, "id", None), getattr(message, "model", None)
            if response_id or model:  # for traces: gen_ai.response.id / .model
                return [ResponseDelta(id=response_id, model=model), *deltas]
            return deltas
        if kind == "content_block_start":
            block = event.content_block
            if block.type == "tool_use":
                return [ToolCallDelta(index=event.index, id=block.id, name=block.name)]
            if block.type == "text" and block.text:
                return [TextDelta(text=block.text)]
            return []
        if kind == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta" and delta.text:
                return [TextDelta(text=delta.text)]
            if delta.type == "input_json_delta" and delta.partial_json:
                return [ToolCallDelta(index=event.index, arguments=delta.partial_json)]
            # Thinking, signature and citation deltas have no place in the common deltas.
            return []
        if kind == "message_delta":
            deltas = self._usage(getattr(event, "usage", None))
            reason = event.delta.stop_reason
            if reason:
                deltas.append(FinishDelta(reason=STOP_REASONS.get(reason, reason)))
            return deltas
        return []

    def _usage(self, usage: Any) -> list[ModelDelta]:
        if usage is None:
            return []
        # Cached prompt tokens are reported apart from `input_tokens` but are input all the same.
        input_parts = [
            getattr(usage, key, None)
            for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        ]
        known = [part for part in input_parts if part is not None]
        input_total = sum(known) if known else None
        output_total = getattr(usage, "output_tokens", None)
        added_in = max(0, input_total - self.input_tokens) if input_total is not None else 0
        added_out = max(0, output_total - self.output_tokens) if output_total is not None else 0
        self.input_tokens += added_in
        self.output_tokens += added_out
        if not (added_in or added_out):
            return []
        return [UsageDelta(input_tokens=added_in, output_tokens=added_out)]
