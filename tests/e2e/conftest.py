"""End-to-end fixtures: kubesim + kasd + agentd as real processes on 127.0.0.1, real kubectl."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml

from kasctl.stack import Stack
from tests.kubesim.kubectl_harness import kubectl_binaries

KUBECTLS = kubectl_binaries()
KUBECTL_CAP = 20  # seconds any one kubectl call may take


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kubectl_bin" in metafunc.fixturenames:
        metafunc.parametrize(
            "kubectl_bin", [path for _, path in KUBECTLS], ids=[f"kubectl-{minor}" for minor, _ in KUBECTLS]
        )
    if "carrier" in metafunc.fixturenames:
        # One stack per carrier for the module (agentd dialling http:// or ws://).
        metafunc.parametrize("carrier", ["h2", "ws"], scope="module")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Over the WebSocket carrier the battery runs with the newest kubectl only: the carrier is
    below kubectl's HTTP, and the suite's time is spent where versions differ (over HTTP/2)."""
    newest = KUBECTLS[-1][1] if KUBECTLS else None
    deselected = [item for item in items if (params := getattr(item, "callspec", None)) is not None
                  and params.params.get("carrier") == "ws" and params.params.get("kubectl_bin", newest) != newest]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


def start_stack(workdir: Path, agent_wait_timeout: float = 2.0, carrier: str = "h2") -> Stack:
    stack = Stack(workdir, agent_wait_timeout=agent_wait_timeout, carrier=carrier)
    stack.start()
    return stack


def module_stack(tmp_path_factory: pytest.TempPathFactory, carrier: str = "h2") -> Iterator[Stack]:
    """The body of a module's shared ``stack`` fixture (here, and for modules outside tests/e2e):
    a stack started once, and every daemon shut down cleanly on SIGTERM at the end."""
    running = start_stack(tmp_path_factory.mktemp("stack"), carrier=carrier)
    try:
        yield running
    finally:
        codes = running.stop()
        assert codes == {"agentd": 0, "kasd": 0, "kubesim": 0}, codes


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack shared by a module's non-destructive tests."""
    yield from module_stack(tmp_path_factory)


@pytest.fixture
def own_stack(tmp_path: Path) -> Iterator[Stack]:
    """A stack of its own, for tests that kill and restart parts of it."""
    # Long enough to cover agentd's reconnect backoff after kasd restarts.
    running = start_stack(tmp_path / "stack", agent_wait_timeout=15.0)
    try:
        yield running
    finally:
        running.stop()


def write_manifest(path: Path, document: object) -> None:
    """``yaml.safe_dump(document)`` into ``path``, through LibYAML when PyYAML has it: the same
    text (PyYAML's two emitters agree), but a 5 MiB scalar takes 0.1 s instead of 5 s of pure Python."""
    dumper = yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper
    path.write_text(yaml.dump(document, Dumper=dumper))


def kubectl(binary: str, stack: Stack, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, "--kubeconfig", str(stack.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=KUBECTL_CAP,
        env=env,
    )


class LineReader:
    """A long-running kubectl (watch, logs -f) whose output lines are read with a deadline."""

    def __init__(self, args: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
                 merge_stderr: bool = False) -> None:
        """``merge_stderr``: read stderr's lines too, interleaved (a command's progress lines)."""
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                                     text=True, cwd=cwd, env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, text: str, timeout: float = KUBECTL_CAP) -> str:
        """The first line containing ``text``; fails if the process ends or time runs out first."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no line with {text!r} within {timeout}s; saw {self.seen}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                stderr = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(f"process ended before printing {text!r}; saw {self.seen}; stderr {stderr}")
            self.seen.append(line)
            if text in line:
                return line

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
