"""Shutdown that drains: open event streams end with a final event before uvicorn stops."""

from __future__ import annotations

import logging
import weakref
from typing import Any, Protocol

import uvicorn

log = logging.getLogger(__name__)


class Drainable(Protocol):
    def shutdown(self) -> None:
        """End the stream soon with its protocol's final event (non-blocking)."""


class Drain:
    """The long-lived responses of one app (SSE feeds), told when shutdown starts.

    Websockets need nothing here: uvicorn closes each with 1012 (service restart) when
    shutdown starts. A stream registered after that ends at once."""

    def __init__(self) -> None:
        self.started = False
        self._streams: weakref.WeakSet[Any] = weakref.WeakSet()

    def track(self, stream: Drainable) -> None:
        self._streams.add(stream)
        if self.started:
            stream.shutdown()

    def start(self) -> int:
        """Tell every open stream to finish; returns how many there were."""
        self.started = True
        streams = list(self._streams)
        for stream in streams:
            stream.shutdown()
        return len(streams)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which first drains the app's streams when shutdown starts: they end
    with a final event within the grace (`timeout_graceful_shutdown`) instead of being
    cancelled when it runs out."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    async def shutdown(self, sockets: Any = None) -> None:
        count = self.drain.start()
        if count:
            log.info("draining %d event stream(s)", count)
        await super().shutdown(sockets=sockets)


def run(app: Any, drain: Drain, **options: Any) -> None:
    """`uvicorn.run(app, **options)` with a DrainingServer (and uvicorn's exit status when
    start-up failed)."""
    server = DrainingServer(uvicorn.Config(app, **options), drain)
    server.run()
    if not server.started:
        raise SystemExit(3)  # uvicorn's STARTUP_FAILURE: the reason is logged already
