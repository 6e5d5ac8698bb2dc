"""A throwaway Prometheus (the distribution's binary) scraping test servers, and its query API."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness import free_port
from tests.services import IN_CI

OVERRIDE = "THREADLINE_TEST_PROMETHEUS"
START_TIMEOUT = 60.0  # a hang guard on a loaded machine
SCRAPE_INTERVAL = "1s"


def prometheus_program() -> str:
    program = os.environ.get(OVERRIDE) or shutil.which("prometheus")
    if not program:
        message = "prometheus is not installed (scripts/ensure-services.sh installs it)"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: services are required)")
        pytest.skip(message)
    assert program is not None
    return program


@dataclass
class Prometheus:
    url: str
    log_path: Path

    def query(self, expression: str) -> list[dict[str, Any]]:
        """The instant vector of `expression` (PromQL), as Prometheus's HTTP API returns it."""
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expression}, timeout=5)
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def value(self, expression: str) -> float | None:
        """The single value of `expression`, None while it has no sample."""
        result = self.query(expression)
        if not result:
            return None
        assert len(result) == 1, result
        return float(result[0]["value"][1])

    def wait_value(self, expression: str, expected: float, timeout: float = 30.0) -> float | None:
        """Query until `expression` equals `expected` (scrapes come every second); the last
        value seen otherwise, for the test's assertion message."""
        deadline = time.monotonic() + timeout
        seen = self.value(expression)
        while seen != expected and time.monotonic() < deadline:
            time.sleep(0.5)
            seen = self.value(expression)
        return seen

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-4000:]
        return ""


def _config(targets: Sequence[tuple[str, str]]) -> str:
    lines = [
        "global:",
        f"  scrape_interval: {SCRAPE_INTERVAL}",
        f"  evaluation_interval: {SCRAPE_INTERVAL}",
        "scrape_configs:",
        "  - job_name: threadline",
        "    static_configs:",
    ]
    for address, role in targets:
        lines += [f"      - targets: ['{address}']", f"        labels: {{role: '{role}'}}"]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def prometheus(targets: Sequence[tuple[str, str]]) -> Iterator[Prometheus]:
    """Prometheus scraping `targets` ((host:port, role) pairs) on a free loopback port, with
    its storage in a temporary directory; stopped and removed after the block."""
    program = prometheus_program()
    directory = Path(tempfile.mkdtemp(prefix="threadline-prometheus-"))
    (directory / "prometheus.yml").write_text(_config(targets))
    port = free_port()
    log_path = directory / "prometheus.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [
                program,
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        running = Prometheus(f"http://127.0.0.1:{port}", log_path)
        try:
            _wait_ready(running, process)
            yield running
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)
            shutil.rmtree(directory, ignore_errors=True)


def _wait_ready(running: Prometheus, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {process.returncode}\n{running.log()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{running.url}/-/ready", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"prometheus not ready after {START_TIMEOUT}s\n{running.log()}")


def scrape(url: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """One scrape of `url` (a /metrics address) without Prometheus: the samples called `name`,
    by their labels."""
    answer = httpx.get(url, timeout=10)
    assert answer.status_code == 200, answer.text
    return {
        frozenset(sample.labels.items()): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
        if sample.name == name
    }


def snapshot_reads(url: str) -> dict[str, float]:
    """A server's snapshot answers so far by source (`storage`, `cache`), from `url`/metrics."""
    counts = {"storage": 0.0, "cache": 0.0}
    for labels, value in scrape(f"{url}/metrics", "threadline_snapshot_reads_total").items():
        source = dict(labels).get("source", "")
        counts[source] = counts.get(source, 0.0) + value
    return counts
