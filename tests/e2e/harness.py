"""Start real `threadline serve` processes for end-to-end tests, and mint tokens for them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-m", "server.cli"]
START_TIMEOUT = 90.0  # a hang guard: a loaded 2-core box can take long to import and bind
STOP_TIMEOUT = 15.0
COMMAND_TIMEOUT = 90.0  # a guard against a hung CLI, not a speed check


def free_port() -> int:
    """A loopback port free right now (the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(database_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a test server: our storage, no delay, no exporters, no Redis."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THREADLINE_", "OTEL_"))}
    env.update(
        {
            "THREADLINE_DATABASE_URL": database_url,
            "THREADLINE_DEMO_DELAY_MS": "0",
            "THREADLINE_LOG_LEVEL": "warning",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


def sqlite_url(directory: Path) -> str:
    return f"sqlite:///{directory / 'threadline.sqlite3'}"


def run_command(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )


def create_token(
    env: dict[str, str],
    scope: str | list[str],
    role: str = "user",
    subject: str | None = None,
    name: str | None = None,
    groups: tuple[str, ...] = (),
) -> str:
    """Mint a token with `threadline token create` against the storage `env` names."""
    scopes = [scope] if isinstance(scope, str) else scope
    args = ["token", "create", "--role", role]
    for item in scopes:
        args += ["--scope", item]
    if subject:
        args += ["--subject", subject]
    if name:
        args += ["--name", name]
    for group in groups:
        args += ["--group", group]
    done = run_command(args, env)
    if done.returncode != 0:
        raise RuntimeError(f"token create failed ({done.returncode}): {done.stderr[-2000:]}")
    lines = done.stdout.splitlines()
    if len(lines) != 1 or not lines[0].strip():
        raise RuntimeError(f"token create printed {done.stdout!r}, expected one line")
    return lines[0].strip()


@dataclass
class ServerHandle:
    """One running server process; `stop()` terminates it and waits."""

    process: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]
    log_path: Path
    role: str
    _log_file: Any = field(repr=False, default=None)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    def token(
        self,
        scope: str | list[str],
        role: str = "user",
        subject: str | None = None,
        name: str | None = None,
        groups: tuple[str, ...] = (),
    ) -> str:
        return create_token(self.env, scope, role, subject, name, groups)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM (graceful shutdown), then SIGKILL if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return int(self.process.returncode)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_healthy(
    url: str, process: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} during start-up")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"server at {url} not healthy after {timeout}s")


def start(
    role: str = "all",
    env: dict[str, str] | None = None,
    port: int | None = None,
    *,
    database_url: str | None = None,
    log_dir: Path | None = None,
    timeout: float = START_TIMEOUT,
    root: Path = ROOT,
) -> ServerHandle:
    """Start `threadline serve --role ROLE` on a free loopback port and wait for /healthz.

    `env` wins over the defaults of `server_env`; without a database URL a temporary SQLite file
    is used. `root`: the source tree whose code runs (`python -m` imports from its working
    directory first), e.g. an export of another commit for a before/after benchmark.
    """
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="threadline-e2e-"))
    env = dict(env) if env else server_env(database_url or sqlite_url(log_dir))
    if database_url:
        env["THREADLINE_DATABASE_URL"] = database_url
    env.setdefault("THREADLINE_DATABASE_URL", sqlite_url(log_dir))
    port = port or free_port()
    log_path = log_dir / f"server-{role}-{port}.log"
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        [*COMMAND, "serve", "--host", "127.0.0.1", "--port", str(port), "--role", role],
        env=env,
        cwd=root,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    handle = ServerHandle(process, port, env, log_path, role, log_file)
    try:
        wait_healthy(handle.url, process, timeout)
    except Exception as exc:
        handle.stop()
        raise RuntimeError(f"{exc}\n--- server log ---\n{handle.log()[-4000:]}") from exc
    return handle
