"""A real Prometheus for the tests (Debian's ``prometheus``; scripts/test.sh installs it when absent,
on CI or when asked with KASD_TEST_INSTALL=1): on 127.0.0.1, a free port, its own storage in a
temporary directory, scraping the given targets every second (and itself, so ``up`` has a series
after its first scrape).

    async with start_prometheus(["127.0.0.1:9102"]) as url:
        await wait_for_series(url, 'up{job="targets"}')   # under the caller's fail_after
        ... GET {url}/api/v1/query?query=up ...

or, for a module's tests sharing one, ``PrometheusProcess(workdir, targets).start()`` / ``.stop()``.
It stops only the process it started.

Starting takes about 0.5 s; the first scrape comes about 5 s after that, whatever the scrape
interval (Prometheus's discovery manager hands targets to the scrapers every 5 s, and 2.42 has no
flag for it). So a test that needs a scraped series waits for it (``wait_for_series``), and tests
that need one share a Prometheus per module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from kasctl.redisproc import free_port

NO_PROMETHEUS = ("no prometheus on this machine: apt-get install prometheus, or run scripts/test.sh with "
                 "KASD_TEST_INSTALL=1 as root (CI installs it and always runs these tests)")
#: how long Prometheus may take to open its storage and say it is ready
START_TIMEOUT = 30.0


def find_prometheus() -> str | None:
    for candidate in (shutil.which("prometheus"), "/usr/bin/prometheus"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


needs_prometheus = pytest.mark.skipif(find_prometheus() is None and not os.environ.get("CI"), reason=NO_PROMETHEUS)
"""For a test that runs Prometheus: skipped, saying why, where there is none; never skipped on CI (it fails)."""


def prometheus_yml(targets: Sequence[str], own: str, scrape_interval: float) -> str:
    """The configuration: job ``targets`` scrapes ``targets``, job ``prometheus`` scrapes itself."""
    interval = f"{int(scrape_interval * 1000)}ms"
    lines = ["global:", f"  scrape_interval: {interval}", f"  evaluation_interval: {interval}",
             "scrape_configs:",
             "  - job_name: prometheus", "    static_configs:", f"      - targets: [{json.dumps(own)}]"]
    if targets:
        lines += ["  - job_name: targets", "    static_configs:",
                  f"      - targets: [{', '.join(json.dumps(t) for t in targets)}]"]
    return "\n".join(lines) + "\n"


class PrometheusProcess:
    def __init__(self, workdir: Path, targets: Sequence[str] = (), *, scrape_interval: float = 1.0) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.targets = list(targets)
        self.scrape_interval = scrape_interval
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.dir / "prometheus.log"

    def start(self) -> PrometheusProcess:
        binary = find_prometheus()
        if binary is None:
            raise AssertionError(NO_PROMETHEUS)
        # A port picked free may be taken (by another test) before Prometheus binds it: another is picked.
        for _ in range(3):
            self.port = free_port()
            config = self.dir / "prometheus.yml"
            config.write_text(prometheus_yml(self.targets, f"127.0.0.1:{self.port}", self.scrape_interval))
            with open(self.log_file, "ab") as log:
                self.proc = subprocess.Popen(
                    [binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{self.port}",
                     f"--storage.tsdb.path={self.dir / 'data'}", "--storage.tsdb.retention.time=1h",
                     "--log.level=warn"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if self._wait_ready():
                return self
            self.stop()
        raise AssertionError(f"prometheus did not start: see {self.log_file}")

    def _wait_ready(self) -> bool:
        # An outside process says nothing when it is ready: its /-/ready is asked, a bounded number of times.
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Stop the process this started (and only it): SIGTERM, then SIGKILL after 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@asynccontextmanager
async def start_prometheus(targets: Sequence[str] = (), *, scrape_interval: float = 1.0,
                           workdir: Path | None = None) -> AsyncIterator[str]:
    """A running Prometheus scraping ``targets`` (``host:port``, path ``/metrics``): its base URL,
    ``http://127.0.0.1:<port>``. (``PrometheusProcess`` is the same for a module-scoped fixture.)"""
    with tempfile.TemporaryDirectory(prefix="kasd-prometheus-") as scratch:
        process = PrometheusProcess(workdir or Path(scratch), targets, scrape_interval=scrape_interval)
        await trio.to_thread.run_sync(process.start)
        try:
            yield process.url
        finally:
            with trio.move_on_after(15, shield=True):
                await trio.to_thread.run_sync(process.stop)


def query(base_url: str, promql: str, **params: str) -> dict[str, Any]:
    """``GET /api/v1/query`` directly (blocking): Prometheus's whole JSON answer."""
    url = f"{base_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql, **params})
    with urllib.request.urlopen(url, timeout=10) as reply:
        document: dict[str, Any] = json.loads(reply.read())
    return document


async def wait_for_series(base_url: str, promql: str) -> list[dict[str, Any]]:
    """The result of ``promql`` once it is not empty (the first scrape has happened). Unbounded:
    the caller bounds it (``with trio.fail_after(…)``)."""
    while True:
        document = await trio.to_thread.run_sync(query, base_url, promql)
        result: list[dict[str, Any]] = document.get("data", {}).get("result", [])
        if result:
            return result
        # Prometheus tells no one when it scrapes: ask again a little later.
        await trio.sleep(0.1)


__all__ = ["NO_PROMETHEUS", "PrometheusProcess", "find_prometheus", "needs_prometheus", "query",
           "start_prometheus", "wait_for_series"]
