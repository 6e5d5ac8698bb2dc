"""OpenAI-compatible chat-completions provider (OpenAI, vLLM, Ollama, llama.cpp) via the SDK."""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import openai
from openai import AsyncOpenAI
from openai.resources.chat.completions import AsyncCompletions

from runtime.domain import MessageRole, ToolCallPart
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

PROVIDER = "openai"
# Local OpenAI-compatible servers (Ollama, llama.cpp, vLLM) ignore the key, but the SDK refuses
# to start without one.
_PLACEHOLDER_KEY = "not-needed"
# Error types an immediate retry cannot fix; any other mid-stream error is treated as transient.
_PERMANENT_ERROR_TYPES = frozenset(
    {"invalid_request_error", "authentication_error", "permission_error", "not_found_error"}
)
_CREATE_PARAMS = frozenset(inspect.signature(AsyncCompletions.create).parameters) - {"self"}


class OpenAICompatModel(SdkModel[AsyncOpenAI]):
    """Streams chat completions; `settings` (temperature, max_tokens, ...) go with every request,
    overridden by `ModelRequest.settings`. Settings the SDK does not know travel in the body as
    they are, for servers with extensions (vLLM's `top_k`, ...).

    The SDK client is created lazily on the running event loop (so constructing an agent needs
    neither a key nor a loop) and closed by `aclose()` / `async with`. An injected `client` is
    used as is and left open.
    """

    sdk_errors = (openai.OpenAIError,)

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        client: AsyncOpenAI | None = None,
        max_retries: int = 2,
        timeout: float | None = 60.0,
        include_usage: bool = True,
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
        # Some older compatible servers reject `stream_options`.
        self.include_usage = include_usage

    def _make_client(self) -> AsyncOpenAI:
        api_key = self.api_key or os.environ.get("OPENAI_API_KEY")
        if api_key is None and self.base_url is not None:
            api_key = _PLACEHOLDER_KEY
        return AsyncOpenAI(
            api_key=api_key,
            base_url=self.base_url,
            max_retries=self.max_retries,
            timeout=self.timeout,
        )

    async def _open_stream(self, client: AsyncOpenAI, kwargs: dict[str, Any]) -> Any:
        return await client.chat.completions.create(**kwargs)

    def _event_mapper(self) -> Callable[[Any], Iterable[ModelDelta]]:
        announced = False

        def deltas(chunk: Any) -> list[ModelDelta]:
            # The response's id and model arrive on every chunk; traces need them once.
            nonlocal announced
            if announced or not getattr(chunk, "id", None):
                return chunk_deltas(chunk)
            announced = True
            response = ResponseDelta(id=chunk.id, model=getattr(chunk, "model", None) or None)
            return [response, *chunk_deltas(chunk)]

        return deltas

    def _failure(self, phase: Phase, exc: BaseException) -> ProviderError:
        return _failure(phase, exc)

    def request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of `chat.completions.create` for `request`."""
        known, extra = split_settings({**self.settings, **request.settings}, _CREATE_PARAMS)
        kwargs: dict[str, Any] = {
            **known,
            "model": self.model,
            "messages": to_chat_messages(request),
            "stream": True,
        }
        if self.include_usage:
            kwargs["stream_options"] = {"include_usage": True}
        if request.tools:
            kwargs["tools"] = [to_chat_tool(spec) for spec in request.tools]
        if extra:
            kwargs["extra_body"] = {**known.get("extra_body", {}), **extra}
        return kwargs


def _failure(phase: Phase, exc: BaseException) -> ProviderError:
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        return provider_failure(
            PROVIDER, phase, exc.message, retryable=is_retryable_status(status), status=status
        )
    if isinstance(exc, (openai.APIConnectionError, *TRANSPORT_ERRORS)):
        return provider_failure(PROVIDER, phase, f"connection failed: {exc}", retryable=True)
    if isinstance(exc, openai.APIError):
        # An `{"error": ...}` event inside a 200 stream: only the body says what went wrong.
        body = exc.body if isinstance(exc.body, dict) else {}
        kind = str(body.get("type") or body.get("code") or "")
        return provider_failure(
            PROVIDER, phase, exc.message, retryable=kind not in _PERMANENT_ERROR_TYPES
        )
    # Client-side configuration problems (no API key, ...): retrying cannot help.
    return provider_failure(PROVIDER, phase, str(exc), retryable=False)


# --- conversion ---------------------------------------------------------------------------------


def to_chat_tool(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def _chat_tool_call(part: ToolCallPart) -> dict[str, Any]:
    return {
        "id": part.tool_call_id,
        "type": "function",
        "function": {"name": part.name, "arguments": json.dumps(part.input)},
    }


def to_chat_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """Instructions as the system message, then one chat message per turn; every tool call is
    followed by its `tool` message, whatever state the call is in."""
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    for message in request.messages:
        if message.role in (MessageRole.SYSTEM, MessageRole.USER):
            text = message_text(message.parts)
            if text:
                messages.append({"role": message.role.value, "content": text})
            continue
        for turn in message_turns(message.parts):
            entry: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
            if turn.tool_calls:
                entry["tool_calls"] = [_chat_tool_call(call) for call in turn.tool_calls]
            elif not turn.text:
                continue
            messages.append(entry)
            for call in turn.tool_calls:
                result = tool_result_content(call)
                messages.append(
                    {"role": "tool", "tool_call_id": call.tool_call_id, "content": result.text}
                )
    return messages


def chunk_deltas(chunk: Any) -> list[ModelDelta]:
    """The normalised deltas of one `chat.completion.chunk`. Only choice 0 is read: a step is
    one completion."""
    deltas: list[ModelDelta] = []
    for choice in chunk.choices or ():
        if choice.index != 0:
            continue
        delta = choice.delta
        if delta is not None:
            if delta.content:
                deltas.append(TextDelta(text=delta.content))
            for position, call in enumerate(delta.tool_calls or ()):
                function = call.function
                index = call.index if call.index is not None else position
                deltas.append(
                    ToolCallDelta(
                        index=index,
                        id=call.id or None,
                        name=(function.name if function else None) or None,
                        arguments=(function.arguments if function else None) or "",
                    )
                )
        if choice.finish_reason:
            deltas.append(FinishDelta(reason=choice.finish_reason))
    usage = getattr(chunk, "usage", None)
    if usage is not None:
        deltas.append(
            UsageDelta(
                input_tokens=usage.prompt_tokens or 0, output_tokens=usage.completion_tokens or 0
            )
        )
    return deltas
