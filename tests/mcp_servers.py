"""MCP servers for tests: the tests' own server over Streamable HTTP, kept up by a supervisor
that restarts it when it dies (as a real deployment's would), and its event log."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "tests" / "mcp_test_server.py"
START_TIMEOUT = 60.0
MAX_RESTARTS = 5


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(port: int, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the MCP test server exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("the MCP test server did not listen in time")


@dataclass
class HttpTestServer:
    """The test server on a loopback port; `restarts` counts how often it was brought back."""

    port: int
    log: Path
    env: dict[str, str]
    restarts: int = 0
    process: subprocess.Popen[bytes] | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [e for e in lines if name is None or e["event"] == name]

    def spawn(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), "http", str(self.port)],
            env={**self.env, "MCP_TEST_LOG": str(self.log)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_listening(self.port, self.process, START_TIMEOUT)

    def supervise(self) -> None:
        """Restart the server each time it exits (bounded), until the test ends."""
        while not self._stopping.is_set() and self.restarts < MAX_RESTARTS:
            assert self.process is not None
            if self.process.poll() is None:
                self._stopping.wait(0.05)
                continue
            if self._stopping.is_set():
                return
            self.restarts += 1
            self.spawn()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@contextmanager
def http_test_server(
    directory: Path, env: dict[str, str] | None = None
) -> Iterator[HttpTestServer]:
    server = HttpTestServer(
        port=free_port(), log=directory / "mcp-events.log", env={**os.environ, **(env or {})}
    )
    server.spawn()
    supervisor = threading.Thread(target=server.supervise, daemon=True)
    supervisor.start()
    try:
        yield server
    finally:
        server._stopping.set()
        supervisor.join(START_TIMEOUT + 10)  # a restart in progress ends before the stop
        server.stop()
