"""The docker-compose stack of the repository, started under a project name of its own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from tests.e2e import harness

ROOT = harness.ROOT
ENSURE_DOCKER = ROOT / "tests" / "deploy" / "ensure-docker.sh"
# The first `up --build` installs every dependency into the image (later runs hit the layer
# cache); nothing else takes more than seconds.
BUILD_TIMEOUT = 1200.0
HEALTH_TIMEOUT = 180.0
COMMAND_TIMEOUT = 120.0
SERVICES = ("postgres", "redis", "gateway", "worker", "lb")


def docker(*args: str, timeout: float = COMMAND_TIMEOUT, check: bool = True) -> str:
    """`docker ARGS...`; its stdout (stderr joins the error when it fails)."""
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    return done.stdout


@dataclass
class Stack:
    """`docker-compose --compatibility -p <project>` on the repository's docker-compose.yml,
    publishing nginx on 127.0.0.1:`port` (THREADLINE_PUBLISH_PORT)."""

    project: str
    port: int
    issued: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    def compose(
        self, *args: str, timeout: float = COMMAND_TIMEOUT, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        # Published on loopback only (compose accepts "address:port" for the host side).
        env = {**os.environ, "THREADLINE_PUBLISH_PORT": f"127.0.0.1:{self.port}"}
        done = subprocess.run(
            ["docker-compose", "--compatibility", "-p", self.project, *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"docker-compose {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done

    def containers(self, service: str, *, all_states: bool = False) -> list[str]:
        """Container ids of `service`, ordered by replica number (name)."""
        flags = ["-a"] if all_states else []
        ids = self.compose("ps", "-q", *flags, service).stdout.split()
        return sorted(ids, key=self.name)

    def name(self, container: str) -> str:
        return docker("inspect", "-f", "{{.Name}}", container).strip().lstrip("/")

    def state(self, container: str, field_path: str) -> str:
        return docker("inspect", "-f", "{{" + field_path + "}}", container).strip()

    def logs(self, container: str) -> str:
        done = subprocess.run(
            ["docker", "logs", container],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        return done.stdout + done.stderr

    def all_logs(self) -> str:
        return self.compose("logs", "--no-color", "--timestamps", check=False).stdout

    def up(self) -> None:
        self.compose("up", "--build", "-d", timeout=BUILD_TIMEOUT)
        self.wait_healthy()

    def wait_healthy(self, timeout: float = HEALTH_TIMEOUT) -> None:
        """Every long-running container healthy (or running, without a health check), the
        one-shot migrate exited 0, and nginx answering /healthz from a gateway."""
        deadline = time.monotonic() + timeout
        problems: list[str] = ["not checked yet"]
        while time.monotonic() < deadline:
            problems = self._unhealthy()
            if not problems:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                        return
                problems = ["nginx does not answer /healthz"]
            time.sleep(1)
        raise TimeoutError(f"stack {self.project} not healthy after {timeout}s: {problems}")

    def _unhealthy(self) -> list[str]:
        problems = []
        for service in SERVICES:
            ids = self.containers(service)
            expected = 2 if service in ("gateway", "worker") else 1
            if len(ids) != expected:
                problems.append(f"{service}: {len(ids)} containers, expected {expected}")
            for container in ids:
                health = docker(
                    "inspect",
                    "-f",
                    "{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}",
                    container,
                ).strip()
                if health not in ("healthy", "running"):
                    problems.append(f"{self.name(container)}: {health}")
        for container in self.containers("migrate", all_states=True):
            code = self.state(container, ".State.ExitCode")
            if self.state(container, ".State.Status") != "exited" or code != "0":
                problems.append(f"migrate: {self.state(container, '.State.Status')} ({code})")
        return problems

    def token(self, scope: str, role: str = "user", subject: str | None = None) -> str:
        """A token minted by `run --rm migrate threadline token create` (as an operator does)."""
        args = ["run", "--rm", "-T", "migrate", "threadline", "token", "create"]
        args += ["--scope", scope, "--role", role]
        if subject:
            args += ["--subject", subject]
        lines = self.compose(*args).stdout.splitlines()
        value = lines[-1].strip() if lines else ""
        assert value.startswith("tl_"), lines
        self.issued.append(value)
        return value

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "-t", "5", timeout=300, check=False)


@contextlib.contextmanager
def started() -> Iterator[Stack]:
    """The stack up and healthy; always torn down (`down -v`), logs printed when start fails."""
    stack = Stack(f"tldeploy{uuid.uuid4().hex[:8]}", harness.free_port())
    try:
        try:
            stack.up()
        except Exception:
            print(f"--- {stack.project} logs ---\n{stack.all_logs()[-8000:]}")
            raise
        yield stack
    finally:
        stack.down()
