"""Provider failures: one ProviderError shape and one telemetry count for every provider."""

from __future__ import annotations

from typing import Literal

from runtime.instruments import PROVIDER_FAILURES, safe_add
from runtime.providers.model_api import ProviderError

Phase = Literal["setup", "stream"]


def _transport_errors() -> tuple[type[BaseException], ...]:
    # Both SDKs run on httpx2; a caller may inject a legacy httpx client. Anthropic's async
    # stream does not wrap transport errors raised while reading the body, so a dropped
    # connection mid-stream arrives as one of these.
    errors: list[type[BaseException]] = []
    try:
        import httpx2

        errors.append(httpx2.TransportError)
    except ImportError:  # pragma: no cover - both SDKs depend on httpx2
        pass
    import httpx

    errors.append(httpx.TransportError)
    return tuple(errors)


TRANSPORT_ERRORS: tuple[type[BaseException], ...] = _transport_errors()


def is_retryable_status(status: int | None) -> bool:
    # 408 request timeout and 409 lock conflicts are retried by both vendors' own SDKs too.
    return status is not None and (status in (408, 409, 429) or status >= 500)


def provider_failure(
    provider: str,
    phase: Phase,
    message: str,
    *,
    retryable: bool,
    status: int | None = None,
) -> ProviderError:
    """A ProviderError, counted in telemetry. The caller raises it `from` the SDK error."""
    safe_add(
        PROVIDER_FAILURES,
        1,
        {
            "provider": provider,
            "phase": phase,
            "retryable": retryable,
            "status": status if status is not None else 0,
        },
    )
    return ProviderError(f"{provider}: {message}", retryable=retryable, status=status)
