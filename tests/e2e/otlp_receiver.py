"""An OTLP/HTTP trace receiver for tests: decodes what a real server exports with the protobufs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass(frozen=True)
class Span:
    name: str
    kind: str  # SPAN_KIND_SERVER, SPAN_KIND_CLIENT, ...
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    links: list[tuple[str, str, dict[str, Any]]]  # (trace id, span id, attributes)


def _span(proto: ProtoSpan) -> Span:
    return Span(
        name=proto.name,
        kind=ProtoSpan.SpanKind.Name(proto.kind),
        trace_id=proto.trace_id.hex(),
        span_id=proto.span_id.hex(),
        parent_span_id=proto.parent_span_id.hex(),
        attributes={a.key: _value(a.value) for a in proto.attributes},
        links=[
            (
                link.trace_id.hex(),
                link.span_id.hex(),
                {a.key: _value(a.value) for a in link.attributes},
            )
            for link in proto.links
        ],
    )


@dataclass
class Receiver:
    port: int
    spans: list[Span] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = [
            _span(span)
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self._changed:
            self.spans.extend(spans)
            self._changed.notify_all()

    def wait_for(self, found: Callable[[list[Span]], bool], timeout: float = 30.0) -> list[Span]:
        """Block until `found(spans)` holds (woken by each export), or fail after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not found(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({s.name for s in self.spans})
                    raise AssertionError(f"spans never arrived; received: {names}")
                self._changed.wait(left)
            return list(self.spans)


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver on a free loopback port for the duration of the block."""
    receiver: Receiver | None = None

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            assert receiver is not None
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            receiver.add(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the test reports what it received

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
