"""What the SDK-backed providers share: a per-loop client, settings routing, the stream loop."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Generic, Protocol, Self, TypeVar

from runtime.providers.failures import TRANSPORT_ERRORS, Phase
from runtime.providers.model_api import ModelDelta, ModelRequest, ProviderError


class _Closable(Protocol):
    """What this base needs of a vendor client (AsyncOpenAI and AsyncAnthropic both have it)."""

    async def close(self) -> None: ...


ClientT = TypeVar("ClientT", bound=_Closable)


def split_settings(
    settings: dict[str, Any], known: frozenset[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Settings the SDK's create() accepts, and the rest (sent as `extra_body` unchanged)."""
    return (
        {k: v for k, v in settings.items() if k in known},
        {k: v for k, v in settings.items() if k not in known},
    )


class SdkModel(abc.ABC, Generic[ClientT]):
    """Base of providers built on an official async SDK client.

    The client is created lazily on the running event loop (so constructing an agent needs
    neither a key nor a loop) and closed by `aclose()` / `async with`; an injected `client` is
    used as is and left open. Subclasses say how to build the client, start a streamed request,
    turn SDK events into deltas and SDK errors into ProviderError.
    """

    sdk_errors: tuple[type[BaseException], ...] = ()

    def __init__(
        self,
        model: str,
        base_url: str | None,
        api_key: str | None,
        *,
        client: ClientT | None,
        max_retries: int,
        timeout: float | None,
        name: str | None,
        provider: str,
        settings: dict[str, Any],
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.api_key = api_key
        self.max_retries = max_retries
        self.timeout = timeout
        self.settings = settings
        self.name = name or f"{provider}:{model}"
        self.provider = provider
        self._injected = client
        self._client: ClientT | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    # --- subclass hooks ----------------------------------------------------------------

    @abc.abstractmethod
    def _make_client(self) -> ClientT: ...

    @abc.abstractmethod
    async def _open_stream(self, client: ClientT, kwargs: dict[str, Any]) -> Any:
        """Start a streamed request; the result is an async iterator of SDK events."""

    @abc.abstractmethod
    def _event_mapper(self) -> Callable[[Any], Iterable[ModelDelta]]:
        """A mapping of SDK events to deltas, fresh for each response (it may keep state)."""

    @abc.abstractmethod
    def _failure(self, phase: Phase, exc: BaseException) -> ProviderError: ...

    @abc.abstractmethod
    def request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of the SDK's create() for `request`."""

    # --- client ------------------------------------------------------------------------

    def _get_client(self) -> ClientT:
        if self._injected is not None:
            return self._injected
        loop = asyncio.get_running_loop()
        # Connection pools belong to the loop that opened them; a new loop needs a new client.
        if self._client is None or self._client_loop is not loop:
            self._client = self._make_client()
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- stream ------------------------------------------------------------------------

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        return self._stream(request)

    async def _stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        # Everything up to the first yield runs at the first __anext__: an HTTP error status or a
        # refused connection surfaces there, where around_model_call can still catch it.
        errors = (*self.sdk_errors, *TRANSPORT_ERRORS)
        kwargs = self.request_kwargs(request)
        try:
            response = await self._open_stream(self._get_client(), kwargs)
        except errors as exc:
            raise self._failure("setup", exc) from exc
        to_deltas = self._event_mapper()
        try:
            while True:
                try:
                    event = await response.__anext__()
                except StopAsyncIteration:
                    break
                except errors as exc:
                    raise self._failure("stream", exc) from exc
                deltas: Iterable[ModelDelta] = to_deltas(event)
                for delta in deltas:
                    yield delta
        finally:
            await response.close()
