"""A real webhook receiver for tests: a Starlette app on a loopback port, in a thread of its own,
verifying every request with the `standardwebhooks` package."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.e2e.harness import free_port


@dataclass
class Received:
    path: str
    webhook_id: str
    body: Any  # the verified JSON, or None when verification failed
    verified: bool
    at: float


# How a path answers the n-th request it got (1-based): a status, or a (status, headers) pair.
Behaviour = Callable[[int], int | tuple[int, dict[str, str]]]


def _no_content(count: int) -> int:
    return 204


@dataclass
class Receiver:
    secret: str
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    hold: threading.Event = field(default_factory=threading.Event)  # set: /hold answers
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def of(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path == path]

    async def _endpoint(self, request: Request) -> Response:
        body = (await request.body()).decode()
        try:
            parsed = Webhook(self.secret).verify(body, dict(request.headers))
            verified = True
        except WebhookVerificationError:
            parsed, verified = None, False
        path = request.url.path
        with self._lock:
            self.received.append(
                Received(path, request.headers.get("webhook-id", ""), parsed, verified, time.time())
            )
            count = sum(1 for r in self.received if r.path == path)
        if path == "/hold" and count == 1:
            # Held until the test releases it (it kills the sender meanwhile); bounded.
            await asyncio.to_thread(self.hold.wait, 30)
        behaviour: Behaviour = self.behaviours.get(path, _no_content)
        answer = behaviour(count)
        status, headers = answer if isinstance(answer, tuple) else (answer, {})
        return Response(status_code=status, headers=headers)

    def start(self) -> None:
        app = Starlette(routes=[Route("/{path:path}", self._endpoint, methods=["POST"])])
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the webhook receiver did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.hold.set()
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=15)
        self._server = self._thread = None
